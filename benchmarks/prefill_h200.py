#!/usr/bin/env python3
"""Prefill through the many-row path on an H200: the kernels against the bf16 tensor-core peak, then the fast
runner's prefill forward on a Flash-geometry slice (`tfc fixture flash-random --layers 4`, 22 GB).

Run on the GPU machine from the repository root, after `source benchmarks/_h200_setup.sh`:
    python3 benchmarks/prefill_h200.py --image IMG/rank0 --out $OUT/prefill_h200.json
Parts, in order (the JSON is rewritten after each): rates, checks, prefill, profile, kernels.
- rates: the bf16 product peak (8192^3, graphed) and the HBM copy rate, as decode_h200.py measures them;
- kernels: exl3_gemm_rows on the slice's layer-0 `wq_b` (1280 x 32768, the largest attention group) and the MoE
  (moe_rows, layer 0's tables, random routes) at several rows, for each launch variant (rows a tile, warps,
  k a step: RowsConfig); each checked against x (as the products see it: exl3_rotate.rows_seen) @ the weight decoded on the
  device (relative Frobenius error < 1e-5)
  before it is timed; TFLOP/s = 2 x rows x the weights a row multiplies / median time; beside it torch's bf16
  product of the same shape on the decoded weight (what a dense bf16 engine's GEMM would do);
- checks: the runner's prefill forward on the slice: a 700-token prompt in one prompt row and in chunks of 300
  and 256 + 1 (the last logits equal bit for bit), and its last logits against the decode steps' (relative L2);
- prefill: 2k and 16k-token prompts through the prefill forward (steps of 256, 1024 and 2048 rows, or 0: the
  decode steps, 16 rows a step, graphed; the MoE
  decodes every expert a step hits once a step, so rows a step set how many rows share a decode), wall time (the
  median of --repeats timed prefills after a first, 3 by default; one until prefill run 19), slice tok/s, the
  whole-Flash projection (the slice's four layers' time scaled by Flash's 40 layers' active weights over the
  slice's, plus the head of every step, timed alone on the HEAD_ROWS rows a step reads) and its share of the
  bf16 peak (2 x Flash's active weights a token, decode_h200.active_params); at 256 rows with the small-op stages compiled and again
  uncompiled, at 1024 and 2048 uncompiled only (each compile of a new width costs minutes of device time);
- profile: torch.profiler over one prefill step (--wide rows) at 2k context (or two steps' worth, within a
  slot's tokens): GPU time by kernel, the largest first.
The many-row products' paths (the linears through the decoded scratch, kernels/exl3/scratch.py; the MoE's
tables on the tiles, kernels/exl3/rows.py) are the kernels' own: a variant of a kernel is a RowsConfig the
kernels part passes.
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import Parts, ensure_tfc

ensure_tfc()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from decode_h200 import active_params, bf16_tflops, copy_gbps, flash_config, timed  # noqa: E402
from tfc.kernels.exl3.rows import RowsConfig  # noqa: E402

ROWS = (256, 1024, 4096)
MOE_TOKENS = (256, 2048)
VARIANTS = {
    f"bm{bm}_w{w}_k{k}": RowsConfig(block_m=bm, num_warps=w, block_k=k)
    for bm, w, k in ((64, 4, 32), (64, 8, 32), (128, 8, 32), (32, 4, 32), (64, 4, 64))
}
PREFILL = (2048, 16384)
WIDE = 256  # the runner's default prefill steps
WIDES = (256, 1024, 2048)  # prefill step rows timed (0: the decode steps, 16 rows a step, graphed)
COMPILED = True  # the default width also timed compiled (with TFC_STAGE_KERNELS=0; else kernels in both)
REPEATS = 3  # timed prefills of each prompt and width after the first (their median is the figure)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def kernels(runner, res: dict) -> None:
    from support.dense_check import DeviceDense
    from tfc.kernels.exl3.rotate import rows_seen
    from tfc.kernels.exl3.rows import exl3_gemm_rows, moe_rows

    w, cfg = runner.forward.weights, runner.forward.cfg
    lin = w.linear("layers.0.attn.wq_b")
    dense = DeviceDense(w)["layers.0.attn.wq_b"]
    bf = dense.bfloat16()
    tables = w.experts("layers.0")
    gen = torch.Generator(device="cuda").manual_seed(0)
    out = {"wq_b": {"k": lin.k, "n": lin.n, "bits": int(lin.trellis.shape[-1]) // 16}, "moe": {}}
    for m in ROWS:
        x = torch.randn(m, lin.k, device="cuda", generator=gen)
        want = rows_seen(x, lin.suh).double() @ dense.double()
        xb = x.bfloat16()
        row = {"bf16_torch_tflops": 2 * m * lin.k * lin.n / timed(lambda xb=xb: xb @ bf) / 1e12}
        for name, config in VARIANTS.items():
            err = rel(exl3_gemm_rows(x, lin.trellis, lin.suh, lin.svh, lin.codebook, config=config), want)
            t = timed(
                lambda x=x, c=config: exl3_gemm_rows(x, lin.trellis, lin.suh, lin.svh, lin.codebook, config=c)
            )
            row[name] = {"rel_err": err, "ok": err < 1e-5, "s": t, "tflops": 2 * m * lin.k * lin.n / t / 1e12}
        out["wq_b"][m] = row
    topk, d, inter = cfg.num_experts_per_tok, cfg.hidden_size, cfg.moe_intermediate_size
    for t_n in MOE_TOKENS:
        x = torch.randn(t_n, d, device="cuda", generator=gen) * 0.1
        ids = torch.stack(
            [torch.randperm(cfg.n_routed_experts, device="cuda", generator=gen)[:topk] for _ in range(t_n)]
        )
        wts = torch.rand(t_n, topk, device="cuda", generator=gen) + 0.1
        flops = 2 * t_n * (topk + 1) * 3 * d * inter
        row = {}
        for name, config in VARIANTS.items():
            t = timed(lambda x=x, ids=ids, wts=wts, c=config: moe_rows(x, ids, wts, tables.w1, tables.w3, tables.w2,
                                                                          cfg.swiglu_limit, config=c),
                      reps=5, warm=2)  # fmt: skip
            row[name] = {"s": t, "tflops": flops / t / 1e12}
        out["moe"][t_n] = row
    res["kernels"] = out


def prompt_logits(runner, slot: int, toks: list[int], size: int) -> torch.Tensor:
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    for lo in range(0, len(toks), size):
        logits = runner.execute(StepPlan((SequenceStep(slot, tuple(toks[lo : lo + size]), lo, prompt=True),)))
    out = logits.logits[0].clone()
    runner.release(slot)
    return out


def checks(runner, res: dict) -> None:
    toks = np.random.default_rng(7).integers(0, runner.info.vocab_size, 700).tolist()
    whole = prompt_logits(runner, 3, toks, len(toks))
    equal = {str(size): bool(torch.equal(prompt_logits(runner, 3, toks, size), whole)) for size in (300, 257)}
    decoded = runner.logits_of(3, toks, 0)[-1]
    runner.release(3)
    res["checks"] = {"chunkings_equal": equal, "wide_vs_decode_rel_l2": rel(whole, decoded),
                     "top1_equal": bool(whole.argmax() == decoded.argmax())}  # fmt: skip
    if not all(equal.values()):
        raise RuntimeError(f"prefill chunkings differ: {equal}")


def wide_runner(runner, rows: int):
    """A runner over the same arena whose prefill steps take `rows` rows (its own graph cache: its decode steps
    are other buffers than `runner`'s)."""
    from types import SimpleNamespace

    from tfc.runtime.graphs.graph_cache import GraphCache, GraphSettings
    from tfc.runtime.models.dsv41.fast.build import build_fast

    w = runner.forward.weights
    booted = SimpleNamespace(image=w.image, arena=w.arena, graphs=GraphCache(GraphSettings()))
    return build_fast(booted, slots=2, tokens_per_slot=max(PREFILL) + 1024, engram=False, prefill_rows=rows)


def prefill(runner, res: dict) -> None:
    from tfc.runtime.models.dsv41.fast import fusion
    from tfc.runtime.models.dsv41.fast.forward import HEAD_ROWS
    from tfc.runtime.models.dsv41.fast.graph_keys import MAX_ROWS
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    cfg, w = runner.forward.cfg, runner.forward.weights
    flash = flash_config()
    layers_ratio = active_params(runner, flash, head=False) / active_params(runner, cfg, head=False)
    flops = 2 * active_params(runner, flash)
    table = {"layers_ratio": layers_ratio, "flash_flop_per_token": flops}

    def run(r, plan) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        r.execute(plan)
        torch.cuda.synchronize()
        r.release(plan.rows[0].slot)
        return time.perf_counter() - started

    for wide in WIDES:
        r = runner if wide == WIDE else wide_runner(runner, wide)
        compiled = wide == WIDE and COMPILED
        step_rows, forward = (wide, r.prefill) if wide else (MAX_ROWS, r.forward)  # 0: the decode steps
        x = torch.randn(HEAD_ROWS if wide else MAX_ROWS, cfg.hidden_size, device="cuda")  # the rows it reads
        head_s = timed(lambda f=forward, x=x: f.ops.linear(x, w.linear("head")), reps=5)
        row = {"head_s_a_step": head_s}
        for n in PREFILL:
            toks = np.random.default_rng(n).integers(0, cfg.vocab_size, n).tolist()
            plan = StepPlan((SequenceStep(1, tuple(toks), 0, prompt=True),))
            # other widths: nothing compiled
            with fusion.eager() if not compiled else contextlib.nullcontext():
                first = run(r, plan)  # the stages of each context bucket compiled (or loaded)
                walls = [run(r, plan) for _ in range(REPEATS)]
            wall = statistics.median(walls)
            steps = -(-n // step_rows)
            flash_s = (wall - steps * head_s) * layers_ratio + steps * head_s
            row[n] = {"wall_s": wall, "walls_s": walls, "first_s": first, "tok_s": n / wall, "steps": steps,
                      "flash_s": flash_s, "flash_tok_s": n / flash_s, "flash_tflops": flops * n / flash_s / 1e12,
                      "peak_fraction": flops * n / flash_s / 1e12 / res["bf16_tflops"]}  # fmt: skip
            print(f"[prefill] width {wide} prompt {n}: {n / wall:.0f} slice tok/s, "
                  f"{row[n]['peak_fraction']:.2%} of the bf16 peak", flush=True)  # fmt: skip
            if compiled:
                with fusion.eager():  # the same steps with the small-op stages uncompiled
                    run(r, plan)
                    row[n]["wall_eager_stages_s"] = run(r, plan)
            res["prefill"] = table | {wide: row}
        table[wide] = row
        if r is not runner:
            del r
            torch.cuda.empty_cache()
    res["prefill"] = table


def profile(runner, res: dict) -> None:
    from tfc.runtime.worker.step import SequenceStep, StepPlan
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    # the profiled step's context, and at least one step before it (within a slot's tokens)
    n = min(max(2048, 2 * WIDE), runner.capacity.tokens_per_slot - 1)
    toks = np.random.default_rng(1).integers(0, runner.info.vocab_size, n).tolist()
    runner.execute(StepPlan((SequenceStep(12, tuple(toks[:-WIDE]), 0, prompt=True),)))
    torch.cuda.synchronize()
    last = StepPlan((SequenceStep(12, tuple(toks[-WIDE:]), n - WIDE, prompt=True),))
    with torch_profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        runner.execute(last)
        torch.cuda.synchronize()
    runner.release(12)
    rows = []
    for e in prof.key_averages():
        gpu = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if (
            gpu > 0
            and e.key
            and not e.key.startswith(("aten::", "cuda", "Torch-Compiled", "CompiledFunction"))
        ):
            rows.append((gpu, e.count, e.key[:90]))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    res["profile"] = {
        "gpu_us": total,
        "kernels": [{"us": round(g, 1), "calls": c, "name": k} for g, c, k in rows[:25]],
    }


def main() -> None:
    global PREFILL, WIDES, COMPILED, WIDE, REPEATS
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True, help="a prepared flash-random --layers 4 image's rank folder")
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument(
        "--budget-s", type=float, default=480, help="parts starting after this many seconds are skipped"
    )
    ap.add_argument("--only", default="", help="comma-separated parts (default: all)")
    ap.add_argument("--prompts", default="2048,16384", help="prompt lengths timed, comma-separated")
    ap.add_argument(
        "--widths",
        default="256,1024,2048",
        help="prefill step rows timed, comma-separated (0: the decode steps)",
    )
    ap.add_argument(
        "--eager", action="store_true", help="time the stages uncompiled only (no compile of any width)"
    )
    ap.add_argument(
        "--wide", type=int, default=256, help="the main runner's prefill step rows (checks, profile)"
    )
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed prefills after the first (median)")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    REPEATS = args.repeats
    try:
        PREFILL = tuple(int(v) for v in args.prompts.split(","))
        WIDES = tuple(int(v) for v in args.widths.split(","))
    except ValueError:
        ap.error(
            f"--prompts and --widths take comma-separated integers; got {args.prompts!r}, {args.widths!r}"
        )
    WIDE = args.wide
    COMPILED = not args.eager
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast.build import build_fast

    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
                 "wide_rows": WIDE, "prompts": PREFILL, "widths": WIDES, "compiled": COMPILED,
                 "parts": {}}  # fmt: skip
    parts = Parts(res, Path(args.out), args.budget_s)
    only = {p for p in args.only.split(",") if p}
    booted = boot(Path(args.image), device="cuda")
    runner = build_fast(
        booted, slots=16, tokens_per_slot=max(PREFILL) + 1024, engram=False, prefill_rows=WIDE
    )
    res["image_bytes"] = booted.arena.nbytes
    parts("rates", lambda: res.update(copy_gbps=copy_gbps(), bf16_tflops=bf16_tflops()))
    from tfc.runtime.models.dsv41.fast import fusion

    for name, fn in (("checks", checks), ("prefill", prefill), ("profile", profile), ("kernels", kernels)):
        if only and name not in only:
            res["parts"][name] = "skipped: --only"
            continue
        with contextlib.nullcontext() if COMPILED else fusion.eager():  # --eager: nothing compiled
            parts(name, lambda fn=fn: fn(runner, res))
    res["runner"] = runner.stats()["prefill"]
    parts.save()


if __name__ == "__main__":
    main()
