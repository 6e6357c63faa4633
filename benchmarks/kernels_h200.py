#!/usr/bin/env python3
"""EXL3 kernels on an H200: correctness at the Flash shapes, then medians against HBM copy and bf16 matmul.

Run on the GPU machine from the repository root:
    PYTHONUNBUFFERED=1 python3 benchmarks/kernels_h200.py --out $OUT
It needs torch + triton only (tfc need not be installed: the kernels are imported through a small shim).
The GPU tests need the same shim and must not run from the repository root (its tfc/ would shadow it):
    mkdir -p /tmp/shim/tfc && touch /tmp/shim/tfc/__init__.py && ln -sf $PWD/tfc/errors.py /tmp/shim/tfc/ \
      && ln -sfn $PWD/kernels /tmp/shim/tfc/kernels && R=$PWD && cd /tmp \
      && PYTHONPATH=/tmp/shim python3 -m pytest -p no:cacheprovider $R/tests/test_kernels_gpu.py
Everything is checked before it is timed; outputs are poisoned (NaN) before every checked run.
Timing: CUDA-graph replays of R back-to-back calls, each on a different copy of the weights (so that the
trellis comes from HBM, not L2), event-timed, median over replays; bf16 matmul timed the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _import_kernels():
    try:
        import tfc.kernels.exl3.gemv  # noqa: F401
    except ImportError:
        shim = Path(tempfile.mkdtemp(prefix="tfc-shim-"))
        (shim / "tfc").mkdir()
        (shim / "tfc" / "__init__.py").write_text("")
        os.symlink(REPO / "tfc" / "errors.py", shim / "tfc" / "errors.py")
        os.symlink(REPO / "kernels", shim / "tfc" / "kernels")
        sys.path.insert(0, str(shim))


_import_kernels()

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
from tfc.kernels.exl3 import reference as ref  # noqa: E402
from tfc.kernels.exl3.decode import exl3_decode  # noqa: E402
from tfc.kernels.exl3.expert_table import ExpertTable  # noqa: E402
from tfc.kernels.exl3.gemv import GemmConfig, exl3_gemm, rotate_for, uses_matrix_units  # noqa: E402
from tfc.kernels.exl3.moe import MoeConfig, moe_exl3, moe_reference  # noqa: E402

DEV = torch.device("cuda")
L2_BYTES = 50 << 20
# Flash shapes (k, n) and bits; codebook mul1 (the default of current conversions).
SHAPES = [  # the large matrices first: run 1 ran out of time before the head
    ("head_6b", 5120, 129280, 6),
    ("wq_b_4b", 1280, 32768, 4),
    ("wo_b_4b", 8192, 5120, 4),
    ("routed_w1_2b", 5120, 2304, 2),
    ("routed_w1_3b", 5120, 2304, 3),
    ("routed_w1_4b", 5120, 2304, 4),
    ("routed_w1_5b", 5120, 2304, 5),
    ("routed_w2_2b", 2304, 5120, 2),
    ("routed_w2_3b", 2304, 5120, 3),
    ("routed_w2_4b", 2304, 5120, 4),
    ("routed_w2_5b", 2304, 5120, 5),
]
ROWS = [1, 4, 8, 16]
DECODE_CHECKS = [("w1_2b_mul1", 5120, 2304, 2, 2), ("w2_3b_3inst", 2304, 5120, 3, 0),
                 ("w1_2.5b_mul1", 5120, 2304, 2.5, 2), ("wkv_6b_mcg", 5120, 512, 6, 1)]  # fmt: skip
MOE_DIMS = (5120, 2304, 384, 6)  # hidden, expert width (TP=1), routed experts, top-k
MOE_LAYOUTS: list[str] = []  # --moe-layouts: the MoE layouts to time (default: all)
# Runs 1-2 (kernels.md) swept the per-element gather decode; run 3 swept the 32-position run decode
# (exl3_runs) against it; kernels_occupancy_h200.py swept k-splits and tile shapes for occupancy (the
# one-row and MoE defaults since). Each table keeps the default and the previous default.
ONE_ROW = {
    # from mma_wide_weights weights (wq_b, wo_b, the head) the weights-as-A mma decode, 4 groups; below, the
    # run decode (runs_default)
    "default": GemmConfig(),
    "runs_default": GemmConfig(
        mma=0
    ),  # from 4 bits: block_k 32, 4 tiles, 1 warp, 32/SM; rotation apart on the head
    "runs_bk32_t4_w1_o32_fused": GemmConfig(
        block_k=32, run_tiles=4, num_warps=1, waves=32, fuse_rotation=True
    ),
    # the previous default (runs 4-9), kept for a same-run comparison
    "runs_bk64_t4_w2_o8_fused": GemmConfig(block_k=64, run_tiles=4, num_warps=2, waves=8),
    # weights decoded into mma from registers (exl3_mma), 1, 2 or 4 groups of two n-tiles per warp, x as A
    "mma_g1": GemmConfig(mma=1, mma_wt=False),
    "mma_g2": GemmConfig(mma=2, mma_wt=False),
    "mma_g4": GemmConfig(mma=4, mma_wt=False),
    # ... with the decoded tile as the mma's A operand (one mma per tile, half the sums; run 19)
    "mma_wt_g1": GemmConfig(mma=1, mma_wt=True),
    "mma_wt_g2": GemmConfig(mma=2, mma_wt=True),
    "mma_wt_g4": GemmConfig(mma=4, mma_wt=True),
    # programs per SM the k-split aims for (default 8 per group; 72 registers let 28 one-warp programs in)
    **{f"mma_wt_g4_o{w}": GemmConfig(mma=4, mma_wt=True, waves=w) for w in (16, 24, 32, 40, 64, 128, 256)},
    "mma_wt_g2_o32": GemmConfig(mma=2, mma_wt=True, waves=32),
    # the k-split partials summed by a second launch, 8 or 32 loaded at a time, and more programs per SM
    "runs_apart": GemmConfig(mma=0, reduce_apart=True),  # the run decode's default from run 25
    "runs_inkernel": GemmConfig(mma=0, reduce_apart=False),  # ... up to run 25: the last program sums
    # programs per SM the run decode's k-split aims for, partials summed apart (default 32 from 4 bits, else 8)
    **{f"runs_o{w}": GemmConfig(mma=0, waves=w) for w in (4, 8, 16, 64)},
    # ... 32 partials loaded at a time instead of 8
    "runs_apart32": GemmConfig(mma=0, reduce_apart=True, reduce_flight=32),
    "runs_apart32_o64": GemmConfig(mma=0, reduce_apart=True, waves=64, reduce_flight=32),
    "wt_apart32": GemmConfig(mma=4, mma_wt=True, reduce_apart=True, reduce_flight=32),
    **{
        f"wt_apart32_o{w}": GemmConfig(mma=4, mma_wt=True, reduce_apart=True, waves=w, reduce_flight=32)
        for w in (64, 128)
    },
}
MANY_ROWS = {  # 2-16 rows: the mma decode (default) against the run decode (fp32 FMAs) and the matrix units
    # up to 8 rows the weights as A, 4 groups on wq_b / wo_b / the head, 1 on a routed matrix; above, x as A
    "default": GemmConfig(),
    # x as A at every row count: 4 groups on the head, 2 on wq_b / wo_b, 1 on a routed matrix (runs 15-18)
    "xa_default": GemmConfig(mma_wt=False),
    "runs_bk16_t1_w2_o8": GemmConfig(use_dot=False, block_k=16, run_tiles=1, num_warps=2, waves=8),
    "runs_bk16_t1_w2_o4": GemmConfig(use_dot=False, block_k=16, run_tiles=1, num_warps=2, waves=4),
    # <= 4 rows up to run 14
    "runs_bk16_t2_w2_o8": GemmConfig(use_dot=False, block_k=16, run_tiles=2, num_warps=2, waves=8),
    "runs_bk32_t2_w2_o4": GemmConfig(
        use_dot=False, block_k=32, run_tiles=2, num_warps=2, waves=4
    ),  # run 6's default
    "dot_bk32_w8_o2": GemmConfig(use_dot=True, block_k=32, num_warps=8, waves=2),
    "dot_bk32_w4_o4": GemmConfig(use_dot=True, block_k=32, num_warps=4, waves=4),  # > 4 rows up to run 14
    "dot_bk32_w4_o4_apart": GemmConfig(use_dot=True, block_k=32, num_warps=4, waves=4, reduce_apart=True),
    "mma_g1": GemmConfig(mma=1, mma_wt=False),
    "mma_g2": GemmConfig(mma=2, mma_wt=False),
    "mma_g4": GemmConfig(mma=4, mma_wt=False),
    "mma_g4_o8": GemmConfig(mma=4, mma_wt=False, waves=8),
    "mma_g2_o8": GemmConfig(mma=2, mma_wt=False, waves=8),
    # the partials summed by the last program
    "mma_g1_inkernel": GemmConfig(mma=1, mma_wt=False, reduce_apart=False),
    "mma_wt_g1": GemmConfig(mma=1, mma_wt=True),
    "mma_wt_g2": GemmConfig(mma=2, mma_wt=True),
    "mma_wt_g4": GemmConfig(mma=4, mma_wt=True),
    **{f"mma_wt_g4_o{w}": GemmConfig(mma=4, mma_wt=True, waves=w) for w in (16, 24, 32, 40, 64, 128, 256)},
    "mma_wt_g2_o32": GemmConfig(mma=2, mma_wt=True, waves=32),
    **{f"mma_g4_o{w}": GemmConfig(mma=4, mma_wt=False, waves=w) for w in (64, 128)},
    # the partials summed by a second launch loading 32 at a time (4 warps) instead of 8 (1 warp)
    "apart32": GemmConfig(reduce_flight=32),
}
MOE = {
    "default": MoeConfig(),  # the mma decode: 4 groups on one width per table, 2 on ragged integer widths
    "runs_default": MoeConfig(mma=0),  # block_k 64, 4 tiles per element, 2 warps, 16 programs/SM
    "runs_bk32_t2_w2_o8": MoeConfig(
        mma=0, block_k=32, run_tiles=2, num_warps=2, waves=8
    ),  # the run decode's default on mixed widths (the MoE's default there up to run 32)
    # the single-width tables' shape, asked for on every table (mixed widths default to the line above)
    "runs_bk64_t4_w2_o16": MoeConfig(mma=0, block_k=64, run_tiles=4, num_warps=2, waves=16),
    # more, shorter k-split programs (more waves, a shorter tail)
    **{f"runs_o{w}": MoeConfig(mma=0, waves=w) for w in (32, 64)},
    # the weights-as-A mma decode, 1, 2 or 4 groups (a branch per width on the ragged layout)
    **{f"mma_g{g}": MoeConfig(mma=g) for g in (1, 2, 4)},
    # programs per SM the mma decode's k-splits aim for (default 8 per group)
    **{f"mma_g4_o{w}": MoeConfig(mma=4, waves=w) for w in (14, 16, 20, 24, 28, 32, 56, 64, 128)},
    # the k-splits up to run 27 (divisors of the k-tiles at 32 programs per SM: gate/up 1.09 waves)
    "mma_g4_div32": MoeConfig(mma=4, split_gate_up=32, split_down=12),
    # the last programs' sums with 16 or 32 partials in flight instead of 8 (the down launch sums 84)
    **{f"flight{f}": MoeConfig(reduce_flight=f) for f in (16, 32)},
    **{f"mma_g2_o{w}": MoeConfig(mma=2, waves=w) for w in (8, 12, 16, 20, 40, 32, 64)},
    # the down launch's k-split alone (4 groups; the default aims both launches at 20 per SM: down split 9)
    **{f"mma_g4_down{d}": MoeConfig(mma=4, split_down=d) for d in (6, 12, 15)},
}
TOL_ONE_ROW, TOL_DOT = 1e-5, 2e-3  # relative Frobenius error vs float64 (fp16 rotated input on matrix units)


def log(*args):
    print(*args, flush=True)


def rand_group(k, n, bits, codebook=2, gen=None):
    width = int(16 * bits)
    trellis = torch.randint(
        -32768, 32768, (k // 16, n // 16, width), dtype=torch.int16, device=DEV, generator=gen
    )
    suh = (torch.randn(k, device=DEV, generator=gen) * 0.02).half()
    svh = (torch.randn(n, device=DEV, generator=gen) * 0.5 + 1.0).half()
    return trellis, suh, svh, codebook


def sync():
    if DEV.type == "cuda":
        torch.cuda.synchronize()


def rel_err(y, want):
    y = y.double()
    if not torch.isfinite(y).all():
        return float("inf")
    return float((y - want).norm() / want.norm())


def graph_time(calls, reps=20):
    """Median microseconds per call of a CUDA graph that runs `calls` back to back."""
    for c in calls:  # compile + warm
        c()
    sync()
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        for c in calls:
            c()
        stream.synchronize()
        with torch.cuda.graph(graph, stream=stream):
            for c in calls:
                c()
    sync()
    times = []
    for _ in range(reps + 3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / len(calls))
    del graph
    return statistics.median(times[3:])


def eager_time(calls):
    """Median microseconds per call without graphs (triton.testing.do_bench, rotating copies)."""
    state = {"i": 0}

    def step():
        calls[state["i"] % len(calls)]()
        state["i"] += 1

    return triton.testing.do_bench(step, warmup=25, rep=100, return_mode="median") * 1000


def copies_for(nbytes, cap=64):
    return max(1, min(cap, -(-4 * L2_BYTES // max(nbytes, 1))))


def copy_bandwidth():
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    t = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=400, return_mode="median")
    return 2 * n / (t / 1000) / 1e9


def check_decode(results):
    """GPU decode vs the numpy reference at real routed shapes (rotated bits exact; full within 1e-5)."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    for name, k, n, bits, cb in DECODE_CHECKS:
        tr, suh, svh, _ = rand_group(k, n, bits, cb, gen)
        out = torch.full((k, n), float("nan"), dtype=torch.float16, device=DEV)
        exl3_decode(tr, suh, svh, cb, rotated=True, out=out)
        want = ref.decode_rotated(tr.cpu().numpy(), cb)
        exact = bool((out.cpu().numpy().view(np.uint16) == want.view(np.uint16)).all())
        full = torch.full((k, n), float("nan"), dtype=torch.float32, device=DEV)
        exl3_decode(tr, suh, svh, cb, out=full)
        dense = ref.dequant(tr.cpu().numpy(), suh.cpu().numpy(), svh.cpu().numpy(), cb)
        err = float(np.abs(full.cpu().numpy() - dense).max() / np.abs(dense).max())
        results["checks"][f"decode_{name}"] = {
            "rotated_bit_exact": exact,
            "max_rel_err": err,
            "ok": exact and err < 1e-5,
        }
        log(f"check decode {name}: exact={exact} err={err:.2e}")


def bench_gemm(results, copy_bw, quick, save):
    gen = torch.Generator(device=DEV).manual_seed(2)
    for name, k, n, bits in SHAPES:
        tr, suh, svh, cb = rand_group(k, n, bits, 2, gen)
        tbytes = tr.numel() * 2
        ncopy = copies_for(tbytes)
        trs = [tr] + [torch.randint_like(tr, -32768, 32768) for _ in range(ncopy - 1)]
        wref = exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
        wbf = exl3_decode(tr, suh, svh, cb, dtype=torch.bfloat16)
        nbf = copies_for(wbf.numel() * 2)
        wbfs = [wbf] + [wbf.clone() for _ in range(nbf - 1)]
        for rows in ROWS:
            x = torch.randn(rows, k, device=DEV, generator=gen).to(torch.bfloat16)
            want = x.double() @ wref
            mm = graph_time([partial(torch.matmul, x, w) for w in wbfs])
            read = tbytes + 2 * (k + n) + 2 * rows * (k + n)
            entry = {"shape": name, "k": k, "n": n, "bits": bits, "rows": rows, "trellis_bytes": tbytes,
                     "bf16_matmul_us": mm, "bf16_bytes": wbf.numel() * 2, "variants": {}}  # fmt: skip
            variants = ONE_ROW if rows == 1 else MANY_ROWS
            for vname, cfg in variants.items():
                out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device=DEV)
                try:
                    exl3_gemm(x, tr, suh, svh, cb, config=cfg, out=out)
                    sync()
                    err = rel_err(out, want)
                    again = exl3_gemm(x, tr, suh, svh, cb, config=cfg)
                    same = bool(torch.equal(again, out))
                    tol = TOL_DOT if uses_matrix_units(cfg, rows, tr.shape) else TOL_ONE_ROW
                    # bf16 output rounding (2^-9) dominates the one-row error; compare in fp32 output too.
                    out32 = exl3_gemm(x, tr, suh, svh, cb, config=cfg, out_dtype=torch.float32)
                    err32 = rel_err(out32, want)
                    t = graph_time([partial(exl3_gemm, x, t_, suh, svh, cb, config=cfg) for t_ in trs])
                    xr = rotate_for(x, suh, cfg, tr.shape)
                    tk = graph_time(
                        [partial(exl3_gemm, xr, t_, suh, svh, cb, config=cfg, x_rotated=True) for t_ in trs]
                    )
                    rec = {"us": t, "kernel_only_us": tk, "err_fp32_out": err32, "err_bf16_out": err,
                           "deterministic": same, "ok": err32 < tol and same,
                           "gbps": read / (t * 1e-6) / 1e9, "kernel_only_gbps": read / (tk * 1e-6) / 1e9,
                           "vs_copy": read / (t * 1e-6) / 1e9 / copy_bw, "speedup_vs_bf16": mm / t}  # fmt: skip
                except Exception as exc:  # a variant that fails to compile or run is reported, not fatal
                    rec = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "ok": False}
                entry["variants"][vname] = rec
                if "us" in rec:
                    log(f"{name} rows={rows} {vname}: {rec['us']:.1f}us ({rec['kernel_only_us']:.1f} kernel) "
                        f"{rec['gbps']:.0f} GB/s, bf16 {mm:.1f}us, err {rec['err_fp32_out']:.1e} ok={rec['ok']}")  # fmt: skip
                else:
                    log(f"{name} rows={rows} {vname}: {rec['error']}")
            best = min((v for v in entry["variants"].items() if v[1].get("ok")), key=lambda kv: kv[1]["us"],
                       default=(None, None))  # fmt: skip
            entry["best"] = best[0]
            if best[0] is not None and not quick:
                cfg = variants[best[0]]
                entry["best_eager_us"] = eager_time(
                    [partial(exl3_gemm, x, t_, suh, svh, cb, config=cfg) for t_ in trs]
                )
                entry["bf16_matmul_eager_us"] = eager_time([partial(torch.matmul, x, w) for w in wbfs])
            results["gemm"].append(entry)
        del trs, wbfs, wref, wbf
        torch.cuda.empty_cache()
        save()


def bench_decode(results, copy_bw):
    gen = torch.Generator(device=DEV).manual_seed(3)
    for name, k, n, bits in [SHAPES[0], SHAPES[-1]]:
        tr, suh, svh, cb = rand_group(k, n, bits, 2, gen)
        out = torch.empty((k, n), dtype=torch.bfloat16, device=DEV)
        t = graph_time([partial(exl3_decode, tr, suh, svh, cb, dtype=torch.bfloat16, out=out)], reps=10)
        moved = tr.numel() * 2 + out.numel() * 2
        results["decode"].append(
            {
                "shape": name,
                "us": t,
                "gbps": moved / (t * 1e-6) / 1e9,
                "vs_copy": moved / (t * 1e-6) / 1e9 / copy_bw,
            }
        )
        log(f"decode {name}: {t:.1f}us {moved / (t * 1e-6) / 1e9:.0f} GB/s (trellis read + bf16 write)")


def bench_moe(results, copy_bw):
    """One token, 6 routed experts of 384 + the shared expert, Flash dims (D 5120, I 2304, TP=1)."""
    gen = torch.Generator(device=DEV).manual_seed(4)
    d, inter, routed, topk = MOE_DIMS
    rng = np.random.default_rng(4)
    layouts = {
        # every entry 4 bits: one stacked table per projection
        "stack_4b": {p: [4] * (routed + 1) for p in ("w1", "w3", "w2")},
        # q28-like: routed 2-5 bits (w1/w3 may differ), shared expert 6 bits
        "ragged_q28": {
            p: [*rng.choice([2, 3, 4, 5], size=routed, p=[0.45, 0.35, 0.15, 0.05]).tolist(), 6]
            for p in ("w1", "w3", "w2")
        },
    }
    for lname, widths in layouts.items():
        if MOE_LAYOUTS and lname not in MOE_LAYOUTS:
            continue
        groups = {}
        tables = {}
        for p, dims in (("w1", (d, inter)), ("w3", (d, inter)), ("w2", (inter, d))):
            groups[p] = [rand_group(*dims, b, 2, gen) for b in widths[p]]
            tables[p] = ExpertTable.build(
                groups[p], layout="stack" if lname.startswith("stack") else "ragged"
            )
        x = torch.randn(1, d, device=DEV, generator=gen).to(torch.bfloat16)
        id_sets = [
            torch.from_numpy(rng.choice(routed, size=(1, topk), replace=False)).to(DEV) for _ in range(16)
        ]
        wts = torch.rand(1, topk, device=DEV, generator=gen) + 0.05
        ids = id_sets[0]
        used = [*ids[0].tolist(), routed]
        dense = {p: [None] * (routed + 1) for p in groups}
        for p in groups:
            for e in used:
                tr, suh, svh, cb = groups[p][e]
                dense[p][e] = exl3_decode(tr, suh, svh, cb, dtype=torch.float32)
        want = moe_reference(x, ids, wts, dense["w1"], dense["w3"], dense["w2"], swiglu_limit=10.0)
        nbytes = 0
        for p in groups:
            for e in used:
                nbytes += groups[p][e][0].numel() * 2 + 2 * (d + inter)
        for vname, cfg in MOE.items():
            out = torch.full((1, d), float("nan"), dtype=torch.float32, device=DEV)
            try:
                moe_exl3(x, ids, wts, tables["w1"], tables["w3"], tables["w2"], config=cfg, out=out)
                sync()
                err = rel_err(out, want)
                t1, t3, t2 = tables["w1"], tables["w3"], tables["w2"]
                t = graph_time([partial(moe_exl3, x, i, wts, t1, t3, t2, config=cfg) for i in id_sets])
                rec = {"us": t, "err": err, "ok": err < 1e-4, "bytes": nbytes, "gbps": nbytes / (t * 1e-6) / 1e9,
                       "vs_copy": nbytes / (t * 1e-6) / 1e9 / copy_bw}  # fmt: skip
                log(
                    f"moe {lname} {vname}: {t:.1f}us {rec['gbps']:.0f} GB/s ({rec['vs_copy']:.0%} of copy) err {err:.1e}"
                )
            except Exception as exc:
                rec = {"error": f"{type(exc).__name__}: {str(exc)[:300]}", "ok": False}
                log(f"moe {lname} {vname}: {rec['error']}")
            results["moe"].append({"layout": lname, "variant": vname, **rec})
        del groups, tables, dense
        torch.cuda.empty_cache()


def table(results):
    copy_bw = results["copy_gbps"]
    lines = [f"copy {copy_bw:.0f} GB/s (read+write)", "",
             "| shape | rows | trellis MB | best variant | EXL3 us (graph) | kernel-only us | GB/s | % copy | bf16 us | speed-up |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for e in results["gemm"]:
        b = e["variants"].get(e["best"]) if e["best"] else None
        if b is None:
            lines.append(
                f"| {e['shape']} | {e['rows']} | {e['trellis_bytes'] / 1e6:.1f} | none ok | | | | | {e['bf16_matmul_us']:.1f} | |"
            )
            continue
        lines.append(f"| {e['shape']} | {e['rows']} | {e['trellis_bytes'] / 1e6:.1f} | {e['best']} | {b['us']:.1f} | "
                     f"{b['kernel_only_us']:.1f} | {b['gbps']:.0f} | {b['vs_copy']:.0%} | {e['bf16_matmul_us']:.1f} | "
                     f"{b['speedup_vs_bf16']:.2f}x |")  # fmt: skip
    for m in results["moe"]:
        if "us" in m:
            lines.append(
                f"moe {m['layout']} {m['variant']}: {m['us']:.1f} us, {m['gbps']:.0f} GB/s = {m['vs_copy']:.0%} of copy"
            )
    for dd in results["decode"]:
        lines.append(f"decode {dd['shape']}: {dd['us']:.1f} us, {dd['gbps']:.0f} GB/s")
    return "\n".join(lines)


def _dry_run():
    """CPU smoke of this script's logic under TRITON_INTERPRET=1: tiny shapes, host timers (no numbers kept)."""
    global DEV, SHAPES, ROWS, L2_BYTES, ONE_ROW, MANY_ROWS, MOE, DECODE_CHECKS, MOE_DIMS
    DEV = torch.device("cpu")
    DECODE_CHECKS = [("tiny_2b", 128, 256, 2, 2), ("tiny_2.5b", 128, 128, 2.5, 2)]
    MOE_DIMS = (128, 256, 6, 2)
    SHAPES = [("tiny_w1", 256, 256, 2), ("tiny_w2", 256, 256, 3)]
    ROWS = [1, 4]
    L2_BYTES = 1 << 12
    ONE_ROW = dict(list(ONE_ROW.items())[:2])
    MANY_ROWS = dict(list(MANY_ROWS.items())[:1])
    MOE = dict(list(MOE.items())[:1])

    def host_time(calls, reps=1):
        t = time.perf_counter()
        for c in calls:
            c()
        return (time.perf_counter() - t) * 1e6 / len(calls)

    globals().update(graph_time=host_time, eager_time=host_time, copy_bandwidth=lambda: 1.0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--quick", action="store_true", help="skip eager (no-graph) timings")
    ap.add_argument("--only", default="", help="comma list of sections: decode,gemm,moe")
    ap.add_argument("--dry", action="store_true", help="CPU smoke under TRITON_INTERPRET=1 (tiny shapes)")
    ap.add_argument("--shapes", default="", help="comma list of shape names to keep (default: all)")
    ap.add_argument(
        "--moe-layouts", default="", help="comma list of MoE layouts to keep: stack_4b,ragged_q28"
    )
    ap.add_argument("--rows", default="", help="comma list of row counts to keep (default: 1,4,16)")
    ap.add_argument("--variants", default="", help="comma list of variant names to keep (default: all)")
    args = ap.parse_args()
    if args.dry:
        _dry_run()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    props = (
        torch.cuda.get_device_properties(DEV)
        if DEV.type == "cuda"
        else type("P", (), {"name": "cpu", "multi_processor_count": 0})
    )
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem",
                              "--format=csv,noheader"], capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    except OSError:
        smi = ""
    results = {"device": props.name, "sms": props.multi_processor_count, "nvidia_smi": smi,
               "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
               "command": " ".join(sys.argv), "checks": {}, "gemm": [], "moe": [], "decode": []}  # fmt: skip
    log(json.dumps({k: results[k] for k in ("device", "sms", "nvidia_smi", "torch", "triton")}))
    results["copy_gbps"] = copy_bandwidth()
    log(f"copy bandwidth {results['copy_gbps']:.0f} GB/s")
    only = set(filter(None, args.only.split(","))) or {"decode", "gemm", "moe"}
    if args.shapes:
        SHAPES[:] = [s for s in SHAPES if s[0] in args.shapes.split(",")]
    if args.moe_layouts:
        MOE_LAYOUTS[:] = args.moe_layouts.split(",")
    if args.rows:
        ROWS[:] = [int(r) for r in args.rows.split(",")]
    if args.variants:
        for table_ in (ONE_ROW, MANY_ROWS, MOE):
            for name in [n for n in table_ if n not in args.variants.split(",")]:
                del table_[name]

    def save():
        (out / "kernels_h200.json").write_text(json.dumps(results, indent=1))

    sections = [("decode", lambda: (check_decode(results), bench_decode(results, results["copy_gbps"]))),
                ("moe", lambda: bench_moe(results, results["copy_gbps"])),
                ("gemm", lambda: bench_gemm(results, results["copy_gbps"], args.quick, save))]  # fmt: skip
    for sec, fn in sections:
        if sec in only:
            try:
                fn()
            except Exception as exc:
                results.setdefault("errors", []).append(f"{sec}: {type(exc).__name__}: {exc}")
                log(f"SECTION {sec} FAILED: {type(exc).__name__}: {exc}")
            (out / "kernels_h200.json").write_text(json.dumps(results, indent=1))
    results["wall_s"] = time.time() - t0
    (out / "kernels_h200.json").write_text(json.dumps(results, indent=1))
    summary = table(results)
    (out / "kernels_h200_table.md").write_text(summary + "\n")
    log(summary)


if __name__ == "__main__":
    main()
