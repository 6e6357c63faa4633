#!/usr/bin/env python3
"""A layer's wo_a groups in one grouped EXL3 launch against one launch each, on the Flash slice (issue #19).

Run on the GPU machine from the repository root, after `source benchmarks/_h200_setup.sh`:
    python3 benchmarks/grouped_h200.py --image <slice rank0> --out $OUT/grouped_h200.json
(`bash benchmarks/h200_serving.sh grouped` makes the slice and runs it.) Parts, each in the JSON as it ends:
- site: layer 0's eight wo_a groups (4096 -> 1024 each) at the decode steps' 16 rows, graphed: one launch each
  (rotation, product, sums: 24 launches) against the grouped launch (3), bits compared;
- decode: two runners on the same arena, the default (grouped) and one whose ops take a launch per group; at 1,
  4 and 16 rows, graph == eager in each, the two runners' logits compared bit for bit, the graphed step timed
  (medians, the two interleaved), the byte floor as decode_h200.py defines it;
- profile: torch.profiler over eager 1-row steps of each runner: kernels a step, GPU time a step, the top 25.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import Parts, ensure_tfc

ensure_tfc()

import torch  # noqa: E402
from decode_h200 import CONTEXT, DEV, ROWS, Floor, copy_gbps, decode_tile, flash_config, graphed, routes_of  # noqa: E402

REPS = 30


def interleaved_us(fns: dict, reps: int = REPS) -> dict:
    """Median µs of each fn, the fns run in turn rep by rep (so drift of the clock hits them alike)."""
    for fn in fns.values():
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    times: dict = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[name].append(a.elapsed_time(b) * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def kernel_profile(runner, tile, steps: int = 5) -> dict:
    """Kernels and GPU time a step of eager runs of `tile`'s step, the top 25 kernels by GPU time."""
    from torch.profiler import ProfilerActivity, profile

    runner.forward.buffers.load(tile, None)
    for _ in range(3):
        runner.forward.step(tile.key)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            runner.forward.step(tile.key)
        torch.cuda.synchronize()
    events = sorted(
        (e for e in p.key_averages() if e.device_time_total > 0), key=lambda e: -e.device_time_total
    )
    return {
        "gpu_us_per_step": sum(e.device_time_total for e in events) / steps,
        "kernels_per_step": sum(e.count for e in events) / steps,
        "top": [{"name": e.key[:100], "us_per_step": e.device_time_total / steps, "calls": e.count / steps}
                for e in events[:25]],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True, help="the slice's prepared rank image")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--budget-s", type=float, default=360.0, help="parts that would start later are skipped")
    args = ap.parse_args()

    from tfc.runtime.boot.rank import boot
    from tfc.runtime.graphs.graph_cache import GraphCache, GraphSettings
    from tfc.runtime.models.dsv41.fast import ops as ops_module
    from tfc.runtime.models.dsv41.fast.build import build_fast

    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "parts": {}}
    parts = Parts(res, Path(args.out), args.budget_s)
    booted = boot(Path(args.image), device="cuda")
    grouped = build_fast(booted, slots=16, tokens_per_slot=CONTEXT + 2048, engram=False)
    # the same forward with a launch per wo_a group: its own graphs and ops, whose linear_groups is a linear a group
    apart = build_fast(SimpleNamespace(image=booted.image, arena=booted.arena, graphs=GraphCache(GraphSettings())),
                       slots=16, tokens_per_slot=CONTEXT + 2048, engram=False)  # fmt: skip
    apart_ops = apart.forward.ops
    if apart_ops is grouped.forward.ops:
        raise RuntimeError("the two runners share their ops")
    apart_ops.linear_groups = lambda x, lins: ops_module.per_group(apart_ops, x, lins)
    cfg = grouped.forward.cfg
    parts("rates", lambda: res.update(copy_gbps=copy_gbps()))

    def site() -> None:
        ops, w = grouped.forward.ops, grouped.forward.weights
        lins = [w.linear(f"layers.0.attn.wo_a.slice.{g}") for g in range(cfg.o_groups)]
        x = torch.randn(16, cfg.o_groups * lins[0].k, device=DEV)
        one = graphed(lambda: ops.linear_groups(x, lins))
        each = graphed(lambda: ops_module.per_group(ops, x, lins))
        same = bool(torch.equal(ops.linear_groups(x, lins), ops_module.per_group(ops, x, lins)))
        t = interleaved_us({"grouped_us": one, "apart_us": each})
        res["site"] = {"shape": [lins[0].k, lins[0].n, int(lins[0].trellis.shape[-1]) // 16], "groups": len(lins),
                       "bits_equal": same, "bytes": sum(lin.nbytes for lin in lins), **t,
                       "speedup": t["apart_us"] / t["grouped_us"]}  # fmt: skip

    parts("site", site)

    def decode() -> None:
        floor = Floor(grouped, flash_config())
        rate = res["copy_gbps"] * 1e9
        table = {}
        for rows in ROWS:
            tiles = {"grouped": decode_tile(grouped, rows), "apart": decode_tile(apart, rows)}
            runners = {"grouped": grouped, "apart": apart}
            logits, eager_equal = {}, {}
            for name, r in runners.items():
                logits[name] = r.launch(tiles[name])[:rows].clone()
                r.forward.step(tiles[name].key)
                eager_equal[name] = bool(torch.equal(logits[name], r.forward.buffers.logits[:rows]))
            routes = routes_of(grouped, tiles["grouped"])
            t = interleaved_us({f"{name}_us": (lambda r=r, k=tiles[name].key: r.replay(k))
                                for name, r in runners.items()})  # fmt: skip
            floor_s = (floor.slice_layers(routes, rows) + floor.head) / rate
            table[rows] = {**t, "graph_equals_eager": eager_equal,
                           "logits_equal": bool(torch.equal(logits["grouped"], logits["apart"])),
                           "floor_us": floor_s * 1e6, "floor_ratio_grouped": floor_s * 1e6 / t["grouped_us"],
                           "floor_ratio_apart": floor_s * 1e6 / t["apart_us"],
                           "speedup": t["apart_us"] / t["grouped_us"]}  # fmt: skip
            for s in range(rows):
                grouped.kv.release(s)
                apart.kv.release(s)
        res["decode"] = table

    parts("decode", decode)

    def prof() -> None:
        res["profile"] = {}
        for name, r in (("grouped", grouped), ("apart", apart)):
            res["profile"][name] = kernel_profile(r, decode_tile(r, 1))
            r.kv.release(0)

    parts("profile", prof)
    parts.save()
    print({k: res.get(k) for k in ("site", "decode")})


if __name__ == "__main__":
    main()
