"""Where a restart's warm-up goes once every compiled stage is saved: the tiny image, cProfile over the warm-up.

    python3 benchmarks/warmup_profile.py --device cuda --out $OUT/warmup_profile_h200.json

Builds the tiny image in a temporary store, runs build_fast + the one-row warm-up step in a fresh process
(compiling and saving the stages), then again in another (the restart), then in a third with the warm-up under
cProfile: the warm-up's seconds, the seconds inside torch's load_compiled_function, the stage counts, and the
functions with the most cumulative and self time. `--variants guards shape` compares stages compiled with every
guard kept (tfc's way) and with the symbolic-shape guards only (torch's guard_filter_fn, set here; each its own
stage folder): what building guards costs a restart.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_cpu import build_image

CHILD = r"""
import cProfile, io, json, pstats, sys, time
import torch
from tfc.runtime.boot.rank import boot
from tfc.runtime.models.dsv41.fast import fusion
from tfc.runtime.models.dsv41.fast.build import build_fast
from tfc.runtime.boot.kernel_cache import use_store_cache
from pathlib import Path
if sys.argv[4] == "shape":  # stages compiled with their symbolic-shape guards only (tfc keeps every guard)
    compile_ = torch.compile
    def _shape_guards(fn, **kw):
        keep = lambda entries: [e.guard_type == "SHAPE_ENV" for e in entries]
        return compile_(fn, **kw, options={"guard_filter_fn": keep})
    torch.compile = _shape_guards
load_ = torch.compiler.load_compiled_function
LOAD = [0.0]
def _timed_load(*a, **kw):
    t0 = time.perf_counter()
    try:
        return load_(*a, **kw)
    finally:
        LOAD[0] += time.perf_counter() - t0
torch.compiler.load_compiled_function = _timed_load
booted = boot(sys.argv[1], device=sys.argv[2])
use_store_cache(booted.image.path, sys.argv[2])  # Triton's cache in the store, as Worker.load_model points it
runner = build_fast(booted, slots=2, tokens_per_slot=4096, fuse=True, draft=False, stage_folder=Path(sys.argv[5]))
prof = cProfile.Profile() if sys.argv[3] == "1" else None
t = time.perf_counter()
if prof:
    prof.enable()
runner.warmup()
if torch.cuda.is_available():
    torch.cuda.synchronize()
if prof:
    prof.disable()
out = {"warmup_s": time.perf_counter() - t, "load_s": LOAD[0], "stages": dict(fusion.COUNTS), "notes": fusion.NOTES}
if prof:
    for order, key in (("cumulative", "top_cumulative"), ("tottime", "top_self")):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(order).print_stats(40)
        out[key] = [line[:220] for line in buf.getvalue().splitlines() if line.strip()][-41:]
print(json.dumps(out))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--variants", nargs="+", default=["guards"], choices=["guards", "shape"])
    args = ap.parse_args()
    res: dict = {"device": args.device}
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(build_image(Path(tmp))) / "rank0"
        for variant in args.variants:
            stages = Path(tmp) / f"stages-{variant}"
            stages.mkdir()
            runs = []
            for profiled in ("0", "0", "1"):
                done = subprocess.run([sys.executable, "-c", CHILD, str(image), args.device, profiled, variant,
                                       str(stages)], capture_output=True, text=True, timeout=900)  # fmt: skip
                if done.returncode:
                    raise SystemExit(done.stderr[-3000:])
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            res[variant] = {"first": runs[0], "restart": runs[1], "restart_profiled": runs[2]}
            print(f"{variant}: first warm-up {runs[0]['warmup_s']:.2f} s {runs[0]['stages']}; restart "
                  f"{runs[1]['warmup_s']:.2f} s, {runs[1]['load_s']:.2f} s of it loading {runs[1]['stages']}; "
                  f"profiled {runs[2]['warmup_s']:.2f} s")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print("\n".join(res[args.variants[0]]["restart_profiled"]["top_cumulative"][:30]))


if __name__ == "__main__":
    main()
