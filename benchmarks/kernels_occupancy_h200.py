#!/usr/bin/env python3
"""EXL3 GEMV/GEMM and MoE on an H200: k-split and tile shape against occupancy, at the Flash shapes.

Nsight Compute (benchmarks/h200_ncu.sh, kernels.md) found every default launch at 0.24-0.43 waves,
8.6-13.7 active warps per SM of 36-40 possible, with long-scoreboard stalls leading. This sweep launches
more programs (larger k-splits, one loop round per program allowed) and other tile shapes, checks each
against float64 (outputs poisoned), and times them as kernels_h200.py does (CUDA-graph replays over
rotating weight copies, medians). From the repository root on the GPU machine:
    python3 benchmarks/kernels_occupancy_h200.py --out $OUT
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import kernels_h200 as kb
import torch
from tfc.kernels.exl3.launch import GemmConfig, num_sms, pick_split
from tfc.kernels.exl3.moe import MoeConfig

SHAPES = {"head_6b": (5120, 129280, 6), "wq_b_4b": (1280, 32768, 4), "wo_b_4b": (8192, 5120, 4),
          "w1_2b": (5120, 2304, 2), "w1_4b": (5120, 2304, 4), "w2_2b": (2304, 5120, 2),
          "w2_4b": (2304, 5120, 4), "w2_5b": (2304, 5120, 5)}  # fmt: skip
# (block_k, tiles per element, warps): warps = elements / 32 for one row (elements = bk/16 * 8/tiles * 8).
TILINGS = {1: [(64, 4, 2), (32, 2, 2), (128, 4, 4), (32, 4, 1)], 4: [(16, 2, 2), (32, 2, 4), (16, 1, 2)]}
WAVES = (8, 16, 24, 32, 48)


def splits_for(k: int, n: int, bk: int) -> list[int]:
    """Distinct k-splits that WAVES programs per SM give with one or more loop rounds per program."""
    got = []
    for waves in WAVES:
        s = pick_split(k // 16, bk // 16, n // 128, num_sms(kb.DEV), waves, min_iters=1)
        if s not in got:
            got.append(s)
    return got


def sweep_gemm(results: dict, copy_bw: float, rows_list: list[int], shapes: list[str]) -> None:
    """Every tiling x split at every shape and row count: error, determinism, graph-timed medians."""
    gen = torch.Generator(device=kb.DEV).manual_seed(2)
    for name in shapes:
        k, n, bits = SHAPES[name]
        tr, suh, svh, cb = kb.rand_group(k, n, bits, 2, gen)
        tbytes = tr.numel() * 2
        trs = [tr] + [torch.randint_like(tr, -32768, 32768) for _ in range(kb.copies_for(tbytes) - 1)]
        wref = kb.exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
        wbf = kb.exl3_decode(tr, suh, svh, cb, dtype=torch.bfloat16)
        wbfs = [wbf] + [wbf.clone() for _ in range(kb.copies_for(wbf.numel() * 2) - 1)]
        for rows in rows_list:
            x = torch.randn(rows, k, device=kb.DEV, generator=gen).to(torch.bfloat16)
            want = x.double() @ wref
            mm = kb.graph_time([partial(torch.matmul, x, w) for w in wbfs])
            read = tbytes + 2 * (k + n) + 2 * rows * (k + n)
            default_us = None
            cands = [("default", GemmConfig())]
            for bk, tpe, warps in TILINGS[rows]:
                for s in splits_for(k, n, bk):
                    cands.append((f"bk{bk}_t{tpe}_w{warps}_s{s}",
                                  GemmConfig(use_dot=False, block_k=bk, run_tiles=tpe, num_warps=warps, split=s)))  # fmt: skip
            for vname, cfg in cands:
                out = torch.full((rows, n), float("nan"), dtype=torch.float32, device=kb.DEV)
                try:
                    kb.exl3_gemm(x, tr, suh, svh, cb, config=cfg, out=out)
                    kb.sync()
                    err = kb.rel_err(out, want)
                    again = kb.exl3_gemm(x, tr, suh, svh, cb, config=cfg, out_dtype=torch.float32)
                    ok = err < kb.TOL_ONE_ROW and bool(torch.equal(again, out))
                    t = kb.graph_time([partial(kb.exl3_gemm, x, t_, suh, svh, cb, config=cfg) for t_ in trs])
                    rec = {"shape": name, "rows": rows, "variant": vname, "us": t, "err": err, "ok": ok,
                           "vs_copy": read / (t * 1e-6) / 1e9 / copy_bw, "speedup_vs_bf16": mm / t,
                           "bf16_us": mm}  # fmt: skip
                    if vname == "default":
                        default_us = t
                    rec["vs_default"] = default_us / t if default_us else None
                    kb.log(f"{name} rows={rows} {vname}: {t:.1f}us {rec['vs_copy']:.0%} copy, bf16 {mm:.1f}us "
                           f"({mm / t:.2f}x), err {err:.1e} ok={ok}")  # fmt: skip
                except Exception as exc:  # a variant that fails is reported, not fatal
                    rec = {"shape": name, "rows": rows, "variant": vname, "ok": False,
                           "error": f"{type(exc).__name__}: {str(exc)[:200]}"}  # fmt: skip
                    kb.log(f"{name} rows={rows} {vname}: {rec['error']}")
                results["gemm"].append(rec)
        del trs, wbfs, wref, wbf
        torch.cuda.empty_cache()


def sweep_moe(results: dict, copy_bw: float) -> None:
    """One token, 6 of 384 routed experts + shared, all 4-bit stack tables: waves and block_k."""
    gen = torch.Generator(device=kb.DEV).manual_seed(4)
    d, inter, routed, topk = kb.MOE_DIMS
    groups = {p: [kb.rand_group(*dims, 4, 2, gen) for _ in range(routed + 1)]
              for p, dims in (("w1", (d, inter)), ("w3", (d, inter)), ("w2", (inter, d)))}  # fmt: skip
    tables = {p: kb.ExpertTable.build(g, layout="stack") for p, g in groups.items()}
    x = torch.randn(1, d, device=kb.DEV, generator=gen).to(torch.bfloat16)
    id_sets = [torch.randperm(routed, device=kb.DEV, generator=gen)[:topk].view(1, topk) for _ in range(16)]
    wts = torch.rand(1, topk, device=kb.DEV, generator=gen) + 0.05
    used = [*id_sets[0][0].tolist(), routed]
    dense = {p: [None] * (routed + 1) for p in groups}
    for p in groups:
        for e in used:
            dense[p][e] = kb.exl3_decode(*groups[p][e], dtype=torch.float32)
    want = kb.moe_reference(x, id_sets[0], wts, dense["w1"], dense["w3"], dense["w2"], swiglu_limit=10.0)
    nbytes = sum(groups[p][e][0].numel() * 2 + 2 * (d + inter) for p in groups for e in used)
    t1, t3, t2 = tables["w1"], tables["w3"], tables["w2"]
    for bk, tpe, warps in ((32, 2, 2), (64, 4, 2), (16, 2, 1)):
        for waves in (8, 16, 24, 32):
            cfg = MoeConfig(block_k=bk, run_tiles=tpe, num_warps=warps, waves=waves)
            vname = f"bk{bk}_t{tpe}_w{warps}_o{waves}"
            out = torch.full((1, d), float("nan"), dtype=torch.float32, device=kb.DEV)
            try:
                kb.moe_exl3(x, id_sets[0], wts, t1, t3, t2, config=cfg, out=out)
                kb.sync()
                err = kb.rel_err(out, want)
                t = kb.graph_time([partial(kb.moe_exl3, x, i, wts, t1, t3, t2, config=cfg) for i in id_sets])
                rec = {"variant": vname, "us": t, "err": err, "ok": err < 1e-4,
                       "vs_copy": nbytes / (t * 1e-6) / 1e9 / copy_bw}  # fmt: skip
                kb.log(f"moe stack_4b {vname}: {t:.1f}us {rec['vs_copy']:.0%} copy err {err:.1e}")
            except Exception as exc:
                rec = {"variant": vname, "ok": False, "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                kb.log(f"moe {vname}: {rec['error']}")
            results["moe"].append(rec)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--rows", default="1,4")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--no-moe", action="store_true")
    ap.add_argument("--dry", action="store_true", help="CPU smoke under TRITON_INTERPRET=1 (tiny shapes)")
    args = ap.parse_args()
    if args.dry:
        kb._dry_run()
        SHAPES.clear()
        SHAPES["tiny"] = (256, 256, 2)
        args.shapes = "tiny"
        TILINGS[1], TILINGS[4] = TILINGS[1][:2], TILINGS[4][:1]
    out = Path(args.out)
    t0 = time.time()
    results = {"device": torch.cuda.get_device_name() if kb.DEV.type == "cuda" else "cpu", "torch": torch.__version__,
               "triton": kb.triton.__version__, "command": " ".join(sys.argv), "gemm": [], "moe": []}  # fmt: skip
    results["copy_gbps"] = kb.copy_bandwidth()
    kb.log(f"copy bandwidth {results['copy_gbps']:.0f} GB/s")
    if not args.no_moe:
        sweep_moe(results, results["copy_gbps"])
    sweep_gemm(results, results["copy_gbps"], [int(r) for r in args.rows.split(",")], args.shapes.split(","))
    results["wall_s"] = time.time() - t0
    (out / "kernels_occupancy_h200.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
