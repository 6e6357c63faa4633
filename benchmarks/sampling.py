"""The sampler's time per token at DeepSeek-V4.1's vocabulary (129,280), logits on the CPU and (where there is
one) on the GPU, greedy and with temperature; both must give the same tokens.

    python benchmarks/sampling.py --out benchmarks/results/sampling/sampling_cpu.json
    python3 benchmarks/sampling.py --out $OUT/sampling_h200.json        # on a GPU host: both rows

One sample() call per token, as the engine makes one per sequence per step; medians of --reps calls.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from tfc.runtime.engine.sampling import SamplingParams, sample

VOCAB = 129280
CASES = {"greedy": SamplingParams(), "temperature 0.7": SamplingParams(temperature=0.7),
         "temperature 0.7, top_p 0.9": SamplingParams(temperature=0.7, top_p=0.9)}  # fmt: skip


def timed(logits: torch.Tensor, params: SamplingParams, reps: int) -> tuple[float, list[int]]:
    times, tokens = [], []
    for i in range(reps):
        if logits.is_cuda:
            torch.cuda.synchronize()
        t = time.perf_counter()
        tokens.append(sample(logits, params, 7, i))
        times.append(time.perf_counter() - t)
    return statistics.median(times), tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 4
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    res: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, torch threads {torch.get_num_threads()}",
                 "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None, "rows": []}  # fmt: skip
    for name, params in CASES.items():
        tokens = {}
        for dev in devices:
            x = logits.to(dev)
            timed(x, params, 3)  # warm
            s, tokens[dev] = timed(x, params, args.reps)
            res["rows"].append({"case": name, "logits_on": dev, "median_ms": s * 1e3})
            print(f"{name:<28} logits on {dev:<4}: {s * 1e3:8.3f} ms a token")
        if len(tokens) > 1 and tokens["cpu"] != tokens["cuda"]:
            raise SystemExit(f"{name}: the GPU logits sampled other tokens than the CPU's")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
