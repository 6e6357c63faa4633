"""The sampler's time per token at DeepSeek-V4.1's vocabulary (129,280), logits on the CPU and (where there is
one) on the GPU, greedy and with temperature; both must give the same tokens.

    python benchmarks/sampling.py --out benchmarks/results/sampling/sampling_cpu.json
    python3 benchmarks/sampling.py --out $OUT/sampling_h200.json        # on a GPU host: both rows

One sample() call per token, medians of --reps calls; then a 16-row step, sampled one row at a time and in one
sample_rows() call (what the engine makes each step), the same tokens both ways; then `penalized` (logit bias
of 16 ids, repetition, frequency and presence penalties) over a 4,096-id history (3,584 prompt + 512 generated),
the time the engine adds before a penalized request's draw, with the same penalized token from every device.
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
from tfc.runtime.engine.sampling import SamplingParams, penalized, sample, sample_rows

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


def step_times(rows: torch.Tensor, params: SamplingParams, reps: int) -> tuple[float, float]:
    """Median seconds to sample every row of a step: one sample() call each, then one sample_rows() call
    (which must give the same tokens)."""
    n = rows.shape[0]
    one, batch = [], []
    for i in range(reps + 2):
        sync = torch.cuda.synchronize if rows.is_cuda else (lambda: None)
        sync()
        t = time.perf_counter()
        alone = [sample(rows[r], params, 7, i * n + r) for r in range(n)]
        one.append(time.perf_counter() - t)
        sync()
        t = time.perf_counter()
        together = sample_rows(rows, [params] * n, [7] * n, [i * n + r for r in range(n)])
        batch.append(time.perf_counter() - t)
        if together != alone:
            raise SystemExit("sample_rows gave other tokens than sample() row by row")
    return statistics.median(one[2:]), statistics.median(batch[2:])


PENALTIES = SamplingParams(temperature=0.7, frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.1,
                           logit_bias=tuple((i * 997, 1.5) for i in range(16)))  # fmt: skip


def penalty_rows(logits: torch.Tensor, devices: list[str], reps: int) -> list[dict]:
    """Median ms of penalized() alone at a 4,096-id history, and of it with the draw, per device."""
    history = torch.randint(0, VOCAB, (4096,), generator=torch.Generator().manual_seed(2)).tolist()
    out, tokens = [], {}
    for dev in devices:
        x = logits.to(dev)
        alone, drawn = [], []
        for i in range(reps + 2):
            sync = torch.cuda.synchronize if x.is_cuda else (lambda: None)
            sync()
            t = time.perf_counter()
            y = penalized(x, PENALTIES, history, 3584)
            sync()
            alone.append(time.perf_counter() - t)
            t = time.perf_counter()
            token = sample(penalized(x, PENALTIES, history, 3584), PENALTIES, 7, i)
            drawn.append(time.perf_counter() - t)
        tokens[dev] = token
        row = {"case": "penalties, 4,096-id history", "logits_on": dev, "penalized_ms": statistics.median(alone[2:]) * 1e3,
               "penalized_and_drawn_ms": statistics.median(drawn[2:]) * 1e3}  # fmt: skip
        print(f"{row['case']:<28} logits on {dev:<4}: {row['penalized_ms']:8.3f} ms penalized, "
              f"{row['penalized_and_drawn_ms']:8.3f} ms with the draw")  # fmt: skip
        out.append(row)
        del y
    if len(set(tokens.values())) > 1:
        raise SystemExit("penalties: the GPU logits gave another token than the CPU's")
    return out


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
    rows = torch.randn(16, VOCAB, generator=torch.Generator().manual_seed(1)) * 4
    for name, params in CASES.items():  # a 16-row step: one batched call against 16 calls
        for dev in devices:
            x = rows.to(dev)
            one, batch = step_times(x, params, args.reps)
            res["rows"].append({"case": name, "logits_on": dev, "rows": 16, "one_by_one_ms": one * 1e3,
                                "batched_ms": batch * 1e3})  # fmt: skip
            print(
                f"{name:<28} logits on {dev:<4}, 16 rows: {one * 1e3:8.3f} ms one by one, {batch * 1e3:8.3f} ms batched"
            )
    res["rows"] += penalty_rows(logits, devices, args.reps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")


if __name__ == "__main__":
    main()
