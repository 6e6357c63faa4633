#!/usr/bin/env python3
"""The decode step on the Flash slice against variants of itself, same arena, same run (issue #19).

Run on the GPU machine from the repository root, after `source benchmarks/_h200_setup.sh`:
    python3 benchmarks/step_variants_h200.py --image <slice rank0> --out $OUT/step_variants.json
(`bash benchmarks/h200_serving.sh variants` makes the slice and runs it; STEP_VARIANTS picks them.)
Every variant is its own runner (own graphs) whose launches are made with one switch turned:
- apart: a launch (rotation, product, sums) per wo_a group instead of the grouped one;
- no_skip: attend_rows computes the runs with no key there (a padding row's, past a row's entries);
- all_rows: the EXL3 products run and sum all 16 rows, not only the live rows;
- pinned16: the EXL3 products' 16-row launch whatever the live rows (ops.ROW_FREE off; the default before
  variants run 8), partials summed for the live rows only;
- flight<N>: the EXL3 products' second launch (the k-split sums) summing N partials at a time with N / 8 warps
  (exl3_gemv.REDUCE_FLIGHT, default 8);
- cap<N>: the EXL3 products' k-split at most N (exl3_gemv.ROW_FREE_MAX_SPLIT; by default set by the waves alone:
  up to 160 partials on the narrow products);
- serial: each layer's KV rows (window row, compressed entries) written in line before its queries
  (fast/overlap.OVERLAP off; on, a side stream beside the queries, by default since variants run 12);
- torchrows: the step's row addresses (window ring rows, each ratio's entries, the pages of picked entries) by
  step_context's torch code (step_context.STEP_KERNELS off), not kernels/step_rows;
- nomake: the candidate-source layer's candidate mask made by the stage's torch code (router_pick.SELECT_MAKES
  off), not in the select kernel;
- torchtap: the drafter's taps of the hc streams by torch's widen, mean, narrow and copy (fp32.TAP_KERNEL off)
  instead of kernels/hidden_tap's one launch a tap;
- selw<N>: the indexer's top-k selection in N warps a row (router_pick.SELECT_WARPS; by default a warp per 64 columns, up to 16);
- mix<N>: the mHC mix product split into N-channel slices (kernels/mhc_stages.MIX_SPLIT; 512 until variants
  run 1, 128 since);
- mixrows<N> / mixstep<N>: the mHC mix product's rows a program (MIX_ROWS, default 32) / K a tl.dot (MIX_STEP,
  default 32);
- split<N>: attend_rows' runs of N key blocks (kernels/attend_rows.SPLIT_BLOCKS, default 4);
- fma: attend_rows' products as fp32 FMA (attend_rows.PIECES 0) instead of bf16 pieces on the matrix units;
- pre: attend_rows' key tables decoded to bf16 first at every row count (attend_keys.predecodes; by default
  only from PREDECODE_ROWS rows, a prefill step's);
- nogather: attend_rows' keys decoded in its runs (attend_keys.GATHER off), not gathered per row first;
- unpaged: the indexer's keys gathered into rows before they are scored (compressed.PAGED off), not read in
  place through the page table.
Parts, each in the JSON as it ends:
- site: layer 0's eight wo_a groups at 16 rows, graphed: one launch each against the grouped launch, bits compared;
- decode: at 1, 4 and 16 rows, graph == eager in each runner, each variant's live logits against the default's
  (bit for bit, or the relative difference and top-1 where a variant changes a summation order), the graphed
  step timed (medians of 30, the runners interleaved), the byte floor as decode_h200.py defines it;
- profile: torch.profiler over eager 1-row steps of the default: kernels a step, GPU time a step, the top 30;
  the torch ops with GPU time of their own, each with the tfc lines calling it (torch_ops).
"""

from __future__ import annotations

import argparse
import contextlib
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
NAMED = (
    "apart",
    "no_skip",
    "all_rows",
    "fma",
    "pre",
    "nogather",
    "unpaged",
    "pinned16",
    "serial",
    "nomake",
    "torchrows",
    "torchtap",
)  # and mix<N>, split<N>, flight<N>, cap<N>, selw<N>
DEFAULT_VARIANTS = "apart,mix512,split2,split1"


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
    """Kernels and GPU time a step of eager runs of `tile`'s step, the top 30 kernels by GPU time."""
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
                for e in events[:30]],
        "torch_ops": torch_op_origins(runner, tile, steps),
    }  # fmt: skip


def torch_op_origins(runner, tile, steps: int) -> list[dict]:
    """The torch ops (aten::) of an eager step that run GPU work of their own, by GPU time a step, each with the
    tfc lines that call it (the Triton kernels are named by the top list already)."""
    from torch.profiler import ProfilerActivity, profile

    verbose = torch._C._profiler._ExperimentalConfig(verbose=True)  # the Python frames of each op
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True,
                 experimental_config=verbose) as p:  # fmt: skip
        for _ in range(steps):
            runner.forward.step(tile.key)
        torch.cuda.synchronize()
    rows = []
    for e in p.key_averages(group_by_stack_n=12):
        own = getattr(e, "self_device_time_total", 0) or 0
        if own <= 0 or not e.key.startswith("aten::"):
            continue
        where = [f for f in (e.stack or []) if not any(s in f for s in ("/torch/", "<built-in", "fusion.py"))]
        rows.append({"op": e.key, "us_per_step": own / steps, "calls": e.count / steps, "from": where[:3]})
    return sorted(rows, key=lambda r: -r["us_per_step"])[:40]


# <prefix><N> variants: the tfc.kernels module attribute each sets to N
NUMBERED = {
    "cap": ("exl3_gemv", "ROW_FREE_MAX_SPLIT"),
    "selw": ("router_pick", "SELECT_WARPS"),
    "flight": ("exl3_gemv", "REDUCE_FLIGHT"),
    "split": ("attend_rows", "SPLIT_BLOCKS"),
    "mix": ("mhc_stages", "MIX_SPLIT"),
    "mixrows": ("mhc_stages", "MIX_ROWS"),
    "mixstep": ("mhc_stages", "MIX_STEP"),
}


def numbered(name: str) -> tuple[str, int] | None:
    """(prefix, N) of a <prefix><N> variant name (the longest prefix that leaves a number > 0), else None."""
    for prefix in sorted(NUMBERED, key=len, reverse=True):
        rest = name[len(prefix) :]
        if name.startswith(prefix) and rest.isdigit() and int(rest) > 0:
            return prefix, int(rest)
    return None


def known_variant(name: str) -> bool:
    """Whether `name` is a variant this script makes."""
    return name in NAMED or numbered(name) is not None


def switches(name: str) -> list[tuple[object, str, object]]:
    """(module, attribute, value) of each module switch variant `name` turns."""
    import importlib

    from tfc.kernels.dsv41 import attend_keys, attend_rows, router_pick
    from tfc.runtime.models.dsv41.fast import compressed, fp32, ops, overlap, step_context

    named = {
        "serial": [(overlap, "OVERLAP", False)],
        "nomake": [(router_pick, "SELECT_MAKES", False)],
        "torchrows": [(step_context, "STEP_KERNELS", False)],
        "torchtap": [(fp32, "TAP_KERNEL", False)],
        "pinned16": [(ops, "ROW_FREE", False)],
        "nogather": [(attend_keys, "GATHER", False)],
        "unpaged": [(compressed, "PAGED", False)],
        "fma": [(attend_rows, "PIECES", 0)],
        "pre": [(attend_keys, "PREDECODE_ROWS", 1), (attend_keys, "PREDECODE", 0)],
        "no_skip": [(attend_rows, "SKIP_EMPTY", False)],
    }
    # no named variant reads as a numbered one (tests/test_benchmark_variants.py)
    if (found := numbered(name)) is not None:
        module, attribute = NUMBERED[found[0]]
        return [(importlib.import_module(f"tfc.kernels.{module}"), attribute, found[1])]
    return named.get(name, [])


@contextlib.contextmanager
def switched(name: str):
    """The module switches of variant `name` turned while its launches are made (captured or eager)."""
    turns = switches(name)
    saved = [(module, attribute, getattr(module, attribute)) for module, attribute, _ in turns]
    for module, attribute, value in turns:
        setattr(module, attribute, value)
    try:
        yield
    finally:
        for module, attribute, value in saved:
            setattr(module, attribute, value)


def variant_runner(booted, name: str):
    """A runner of its own graphs and ops on the booted arena, its ops switched as variant `name` says."""
    from tfc.runtime.graphs.graph_cache import GraphCache, GraphSettings
    from tfc.runtime.models.dsv41.fast import ops as ops_module
    from tfc.runtime.models.dsv41.fast.build import build_fast

    runner = build_fast(SimpleNamespace(image=booted.image, arena=booted.arena, graphs=GraphCache(GraphSettings())),
                        slots=16, tokens_per_slot=CONTEXT + 2048, engram=False)  # fmt: skip
    ops = runner.forward.ops
    if name == "apart":
        ops.linear_groups = lambda x, lins, live=None: ops_module.per_group(ops, x, lins, live)
    if name == "all_rows":
        linear, groups = ops.linear, ops.linear_groups
        ops.linear = lambda x, lin, live=None: linear(x, lin)
        ops.linear_groups = lambda x, lins, live=None: groups(x, lins)
    return runner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True, help="the slice's prepared rank image")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument(
        "--variants", default=DEFAULT_VARIANTS, help=f"comma-separated (default {DEFAULT_VARIANTS})"
    )
    ap.add_argument("--budget-s", type=float, default=360.0, help="parts that would start later are skipped")
    args = ap.parse_args()

    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast import ops as ops_module
    from tfc.runtime.models.dsv41.fast.build import build_fast

    names = [v for v in args.variants.split(",") if v]
    bad = [v for v in names if not known_variant(v)]
    if bad or not names:
        ap.error(
            f"unknown variants {bad or '(none given)'}; known: {', '.join(NAMED)}, {', '.join(p + '<N>' for p in NUMBERED)}"
        )
    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "variants": names,
        "parts": {},
    }
    parts = Parts(res, Path(args.out), args.budget_s)
    booted = boot(Path(args.image), device="cuda")
    runners = {"default": build_fast(booted, slots=16, tokens_per_slot=CONTEXT + 2048, engram=False)}
    runners |= {name: variant_runner(booted, name) for name in names}
    if len({id(r.forward.ops) for r in runners.values()}) != len(runners):
        raise RuntimeError("the runners share their ops")
    default = runners["default"]
    cfg = default.forward.cfg
    parts("rates", lambda: res.update(copy_gbps=copy_gbps()))

    def site() -> None:
        ops, w = default.forward.ops, default.forward.weights
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
        floor = Floor(default, flash_config())
        rate = res["copy_gbps"] * 1e9
        lin = default.forward.weights.linear("head")
        x = torch.randn(16, lin.k, device=DEV)
        table = {}
        for rows in ROWS:  # the head as the step runs it: 16 rows, these live
            live = rows if rows < 16 else None
            head_us = interleaved_us(
                {"head": graphed(lambda live=live: default.forward.ops.linear(x, lin, live))}
            )["head"]
            tiles = {name: decode_tile(r, rows) for name, r in runners.items()}
            logits, eager_equal = {}, {}
            for name, r in runners.items():
                with switched(name):
                    logits[name] = r.launch(tiles[name])[:rows].clone()
                    r.forward.step(tiles[name].key)
                eager_equal[name] = bool(torch.equal(logits[name], r.forward.buffers.logits[:rows]))
            routes = routes_of(default, tiles["default"])
            t = interleaved_us(
                {name: (lambda r=r, k=tiles[name].key: r.replay(k)) for name, r in runners.items()}
            )
            layers_floor = floor.slice_layers(routes, rows)
            floor_us = (layers_floor + floor.head) / rate * 1e6
            # whole Flash (TP=1, 4k context) at the efficiency the slice's layers reached (decode_h200.py's way)
            eff = layers_floor / rate * 1e6 / max(t["default"] - head_us, 1e-9)
            flash_us = floor.flash_layers(routes, rows) / rate * 1e6 / eff + head_us
            base = logits["default"]
            table[rows] = {
                "step_us": t, "floor_us": floor_us, "graph_equals_eager": eager_equal, "head_us": head_us,
                "flash_step_us": flash_us, "flash_tok_s": rows / flash_us * 1e6,
                "floor_ratio": {name: floor_us / us for name, us in t.items()},
                "default_speedup": {name: us / t["default"] for name, us in t.items() if name != "default"},
                "logits_equal_default": {name: bool(torch.equal(v, base)) for name, v in logits.items()},
                "logits_rel_diff": {name: float((v - base).norm() / base.norm()) for name, v in logits.items()},
                "top1_equal": {name: bool(torch.equal(v.argmax(-1), base.argmax(-1))) for name, v in logits.items()},
            }  # fmt: skip
            for r in runners.values():
                for s in range(rows):
                    r.kv.release(s)
        res["decode"] = table

    parts("decode", decode)
    parts("profile", lambda: res.update(profile=kernel_profile(default, decode_tile(default, 1))))
    parts.save()
    print({k: res.get(k) for k in ("site", "decode")})


if __name__ == "__main__":
    main()
