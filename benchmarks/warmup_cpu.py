"""What a restart's warm-up costs when the fast forward's stages are compiled: the tiny image on the CPU.

    python benchmarks/warmup_cpu.py --out benchmarks/results/serve/warmup_cpu.json

Runs, in fresh processes one after another, build_fast with the stages compiled (inductor, as on a GPU) and
the one-row warm-up step, first with an empty inductor cache, then `--restarts` times with it warm: the
seconds of each phase and what torch.compile spent (dynamo's compile_inner per graph, the graphs compiled);
then the one-row step of the next context bucket (what a sequence growing past 2,048 tokens meets mid-serving).
The stages are saved in the temporary store (stage_cache.py) unless `--no-stage-cache`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from tfc.runtime.boot.rank import boot
from tfc.runtime.models.dsv41.fast.build import build_fast
t1 = time.perf_counter()
booted = boot(sys.argv[1], device="cpu")
t2 = time.perf_counter()
runner = build_fast(booted, slots=2, tokens_per_slot=4096, fuse=True, draft=False)
t3 = time.perf_counter()
runner.warmup()
t4 = time.perf_counter()
import torch._dynamo.utils as du
from tfc.runtime.models.dsv41.fast.graph_keys import StepKey
first_graphs = du.counters["stats"]["unique_graphs"]
names, values = du.compile_times(repr="csv")
inner = [float(v) for v in dict(zip(names, values)).get("_compile.compile_inner", "").split(",") if v.strip()]
runner.warmup([StepKey(1, runner.buckets[1])])  # the next context bucket, as a growing sequence reaches it
t5 = time.perf_counter()
from tfc.runtime.models.dsv41.fast import fusion
print(json.dumps({"import_s": t1 - t0, "boot_s": t2 - t1, "build_s": t3 - t2, "warmup_s": t4 - t3,
                  "graphs": first_graphs, "compile_inner_s": inner, "next_bucket_s": t5 - t4,
                  "next_bucket_graphs": du.counters["stats"]["unique_graphs"] - first_graphs,
                  "eager_stages": fusion.NOTES}))
"""


def tfc(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "tfc", *args], capture_output=True, text=True, check=True)
    return r.stdout.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument(
        "--no-stage-cache", action="store_true", help="TFC_STAGE_CACHE=0: torch.compile every process"
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tfc("fixture", "tiny", f"{tmp}/pack")
        image = tfc("prepare", f"{tmp}/pack", "--store", f"{tmp}/store")
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": f"{tmp}/inductor",
            "OMP_NUM_THREADS": "1",
            "TFC_STAGE_CACHE": "0" if args.no_stage_cache else "1",
        }
        runs: list[dict] = []
        for i in range(1 + args.restarts):
            started = time.perf_counter()
            out = subprocess.run(
                [sys.executable, "-c", CHILD, image], capture_output=True, text=True, env=env
            )
            if out.returncode:
                raise SystemExit(f"run {i} failed: {out.stderr.strip().splitlines()[-1]}")
            run = json.loads(out.stdout.strip().splitlines()[-1])
            run["process_s"] = time.perf_counter() - started
            runs.append(run)
            print(f"{'cold' if i == 0 else 'warm'}: warmup {run['warmup_s']:.2f} s, {run['graphs']} graphs, "
                  f"compile_inner {sum(run['compile_inner_s']):.2f} s (first {(run['compile_inner_s'] or [0.0])[0]:.2f} s); "
                  f"next bucket {run['next_bucket_s']:.2f} s, {run['next_bucket_graphs']} graphs")  # fmt: skip
    warm = runs[1:]
    res = {"machine": f"{os.cpu_count()} cores", "stage_cache": not args.no_stage_cache, "cold": runs[0], "restarts": warm,
           "restart_warmup_median_s": statistics.median(r["warmup_s"] for r in warm),
           "restart_compile_inner_median_s": statistics.median(sum(r["compile_inner_s"]) for r in warm),
           "restart_next_bucket_median_s": statistics.median(r["next_bucket_s"] for r in warm)}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
