#!/usr/bin/env python3
"""The fast forward's small-op stages on an H200, each two ways: as written (eager torch, the kernels' reference)
and as its plain Triton kernel (tfc.kernels.*).

Run on the GPU machine from the repository root, after `source benchmarks/_h200_setup.sh`:
    python3 benchmarks/stages_h200.py --image IMG/rank0 --out $OUT/stages_h200.json      # about a minute
IMG: a prepared `tfc fixture flash-random --layers 4` (the real per-layer shapes). One decode step of 16 rows
(the exact launches' rows: every stage sees 16 whatever the live rows) at a 4k context runs eagerly with every
stage's arguments recorded at its first call; each stage is then called alone on those very tensors.

Per stage: `us` the median time of one call (a CUDA graph of CALLS calls replayed REPS times, the median
replay / CALLS), `kernels` the CUDA kernels one call launches (torch.profiler, eager), and the kernel's
difference from eager torch: `rel_err` max |kernel - eager| / max |eager| over its float outputs, `bytes_differ`
the share of differing bytes of a packed (uint8) output, `ids_differ` the share of differing indices.
`step_estimate`: a step's stage time and launches, each stage's calls a step times its first call's figures
(later calls of a stage may have other shapes: the indexer's chunks, the entries of another source).
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import ensure_tfc

ensure_tfc()
import torch  # noqa: E402

CALLS, REPS = 10, 15
CONTEXT = 4096


def per_call_us(fn) -> float:
    """Median microseconds of one call of fn, from a graph of CALLS calls."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(CALLS):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / CALLS)
    return statistics.median(times)


def kernels_of(fn) -> int:
    """CUDA kernels one call of fn launches."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def outputs(x) -> list[torch.Tensor]:
    """The tensors of a stage's result (a tensor or a tuple, Nones dropped)."""
    return [t for t in (x if isinstance(x, tuple) else (x,)) if isinstance(t, torch.Tensor)]


def difference(want, got) -> dict:
    """How the kernel's outputs differ from eager torch's."""
    out: dict = {}
    for i, (w, g) in enumerate(zip(outputs(want), outputs(got), strict=True)):
        key = f"out{i}"
        if w.shape != g.shape or w.dtype != g.dtype:
            out[key] = f"shape/dtype {tuple(g.shape)} {g.dtype} != {tuple(w.shape)} {w.dtype}"
        elif w.dtype == torch.uint8:
            out[key] = {"bytes_differ": float((w != g).float().mean())}
        elif not w.is_floating_point():
            out[key] = {"ids_differ": float((w != g).float().mean())}
        else:
            scale = float(w.double().abs().max()) or 1.0
            out[key] = {"rel_err": float((w.double() - g.double()).abs().max()) / scale}
    return out


def measure(fn, kernel, a: tuple, k: dict) -> dict:
    """One stage's row: the kernel's difference from eager, and each way's time and launches a call."""
    row: dict = {}
    try:
        row["difference"] = difference(fn(*a, **k), kernel(*a, **k))
        for label, f in (("eager", fn), ("kernel", kernel)):
            row[label] = {
                "us": per_call_us(lambda f=f: f(*a, **k)),
                "kernels": kernels_of(lambda f=f: f(*a, **k)),
            }
    except Exception as error:  # one stage's failure is its row, the others still run
        row["error"] = f"{type(error).__name__}: {' '.join(str(error).split())[:400]}"
    return row


def stage_wrappers() -> dict:
    """{kernel path: (stage name, its torch function)} of every fused stage that names a kernel."""
    from tfc.runtime.models.dsv41.fast import attention, compressed, engram, fp32, moe

    found = {}
    for m in (attention, compressed, engram, fp32, moe):
        for name in dir(m):
            run = getattr(m, name)
            if getattr(run, "stage_kernel", None):
                found[run.stage_kernel] = (name, run.stage_fn)
    return found


def record_calls(runner) -> dict:
    """{kernel path: [args, kwargs, calls]} of each stage's first call in one eager decode step of 16 rows (the stages as
    written), and how many calls of it the step made."""
    from tfc.runtime.models.dsv41.fast import stages
    from tfc.runtime.models.dsv41.fast.step_plan import TileRow, make_tile

    seen: dict = {}
    real = stages._kernel

    def spy(path, args, kwargs):
        seen.setdefault(path, [args, kwargs, 0])[2] += 1
        return None  # the stage as written

    for s in range(16):
        runner.kv.ensure(s, CONTEXT)
    live = [TileRow(s, (7919 * s + 11) % runner.info.vocab_size, CONTEXT - 1) for s in range(16)]
    tile = make_tile(live, runner.kv.dummy_slot, runner.buckets)
    stages._kernel = spy
    try:
        runner.forward.buffers.load(tile, None)
        runner.forward.step(tile.key)
        torch.cuda.synchronize()
    finally:
        stages._kernel = real
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True, help="a prepared flash-random --layers 4 rank folder")
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args()

    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast.build import build_fast

    booted = boot(Path(args.image), device="cuda")
    runner = build_fast(booted, slots=16, tokens_per_slot=CONTEXT + 1024, engram=False, draft=False)
    calls = record_calls(runner)
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
           "rows": 16, "context": CONTEXT, "stages": {}}  # fmt: skip
    for path, (name, fn) in sorted(stage_wrappers().items(), key=lambda kv: kv[1][0]):
        if path not in calls:
            res["stages"][name] = "not called in this step"
            continue
        a, k, count = calls[path]
        module, attr = path.split(":")
        kernel = getattr(importlib.import_module(module), attr)
        row = measure(fn, kernel, a, k)
        row.update(stage_kernel=path, calls_a_step=count)
        res["stages"][name] = row
        print(f"[{name}] {json.dumps(row)}", flush=True)
    rows = [r for r in res["stages"].values() if isinstance(r, dict) and "error" not in r]
    total = {v: sum(r[v]["us"] * r["calls_a_step"] for r in rows) for v in ("eager", "kernel")}
    launches = {v: sum(r[v]["kernels"] * r["calls_a_step"] for r in rows) for v in ("eager", "kernel")}
    res["step_estimate"] = {"us": total, "kernels": launches,
                            "how": "sum over stages of calls a step x one call at the first call's shapes"}  # fmt: skip
    print(f"[total] a step's stages (calls x first call): {json.dumps(res['step_estimate'])}")
    Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
