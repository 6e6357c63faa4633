#!/usr/bin/env python3
"""The EXL3 kernels at DeepSeek-V4.1-Flash's shapes, at their default launch configs: one-row GEMV and 4 / 16-row
GEMM against the HBM copy rate and torch's bf16 product of the same shape, and the one-token MoE against the copy
rate, each checked against float64 before it is timed.

    python benchmarks/kernels.py [--rows 1,4,16] [--json]          # about a minute on a GPU, most of it compiles
    python benchmarks/kernels.py --device cpu                      # tiny shapes under Triton's interpreter: a smoke

Timing: a CUDA graph of back-to-back calls, each on another copy of the weights (the trellis comes from HBM, not
L2), median of its replays between CUDA events, per call; torch's bf16 product timed the same way on the decoded
weight. Bytes a call reads: the trellis, the scales and the rows in and out. MoE: one token, 6 routed experts of
384 and the shared one, on a 4-bit stacked table and on a ragged 2-6-bit table (the real packs' shape).
"""

from __future__ import annotations

import os
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c
import torch

L2_BYTES = 50 << 20
SHAPES = {"cuda": [("head_6b", 5120, 129280, 6), ("wq_b_4b", 1280, 32768, 4), ("wo_b_4b", 8192, 5120, 4),
                   ("routed_w1_3b", 5120, 2304, 3), ("routed_w2_3b", 2304, 5120, 3)],
          "cpu": [("tiny_w1_2b", 256, 256, 2), ("tiny_w2_3b", 256, 256, 3)]}  # fmt: skip
MOE_DIMS = {
    "cuda": (5120, 2304, 384, 6),
    "cpu": (128, 256, 6, 2),
}  # hidden, expert width (TP=1), routed, top-k
TOL = 2e-3  # relative Frobenius error against float64: the products take fp16 rows on the matrix units


def rand_group(device: str, k: int, n: int, bits: int, gen):
    trellis = torch.randint(-32768, 32768, (k // 16, n // 16, 16 * bits), dtype=torch.int16, device=device,
                            generator=gen)  # fmt: skip
    suh = (torch.randn(k, device=device, generator=gen) * 0.02).half()
    svh = (torch.randn(n, device=device, generator=gen) * 0.5 + 1.0).half()
    return trellis, suh, svh, 2


def rel_err(y, want) -> float:
    y = y.double()
    return float((y - want).norm() / want.norm()) if torch.isfinite(y).all() else float("inf")


def per_call(device: str, calls) -> float:
    """Median seconds a call of a graph running `calls` back to back (on the CPU: the host's clock)."""
    if device != "cuda":  # the interpreter: one call, once, is what a smoke can afford
        return c.host_timed(calls[0], reps=1, warm=0)
    return c.cuda_timed(c.graphed(lambda: [f() for f in calls]), reps=20) / len(calls)


def copies_for(nbytes: int, l2: int) -> int:
    return max(1, min(64, -(-4 * l2 // max(nbytes, 1))))


def gemm(device: str, rows_list, copy: float, l2: int) -> list[dict]:
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.gemv import exl3_gemm

    gen = torch.Generator(device=device).manual_seed(2)
    out = []
    for name, k, n, bits in SHAPES[device]:
        tr, suh, svh, cb = rand_group(device, k, n, bits, gen)
        trs = [tr] + [
            torch.randint_like(tr, -32768, 32768) for _ in range(copies_for(tr.numel() * 2, l2) - 1)
        ]
        want_w = exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
        wbf = exl3_decode(tr, suh, svh, cb, dtype=torch.bfloat16)
        wbfs = [wbf] + [wbf.clone() for _ in range(copies_for(wbf.numel() * 2, l2) - 1)]
        for rows in rows_list:
            x = torch.randn(rows, k, device=device, generator=gen).to(torch.bfloat16)
            got = torch.full((rows, n), float("nan"), dtype=torch.float32, device=device)
            exl3_gemm(x, tr, suh, svh, cb, out=got)
            err = rel_err(got, x.double() @ want_w)
            if err > TOL:
                raise RuntimeError(f"exl3_gemm {name} at {rows} rows: error {err:.1e} against float64")
            s = per_call(device, [partial(exl3_gemm, x, t, suh, svh, cb) for t in trs])
            bf16 = per_call(device, [partial(torch.matmul, x, w) for w in wbfs])
            read = tr.numel() * 2 + 2 * (k + n) + 2 * rows * (k + n)
            out.append({"shape": name, "k": k, "n": n, "bits": bits, "rows": rows, "us": s * 1e6, "err": err,
                        "gbps": read / s / 1e9, "vs_copy": read / s / 1e9 / copy, "bf16_us": bf16 * 1e6,
                        "vs_bf16": bf16 / s})  # fmt: skip
            print(f"[kernels] {name} {rows} rows: {s * 1e6:,.1f} µs, {read / s / 1e9:,.0f} GB/s "
                  f"({read / s / 1e9 / copy:.0%} of copy), {bf16 / s:.2f}x bf16", flush=True)  # fmt: skip
        del trs, wbfs
    return out


def moe(device: str, copy: float) -> dict:
    import numpy as np
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.expert_table import ExpertTable
    from tfc.kernels.exl3.moe import moe_exl3, moe_reference

    d, inter, routed, topk = MOE_DIMS[device]
    gen, rng = torch.Generator(device=device).manual_seed(4), np.random.default_rng(4)
    layouts = {"stack4b": {p: [4] * (routed + 1) for p in ("w1", "w3", "w2")},
               "ragged": {p: [*rng.choice([2, 3, 4, 5], size=routed, p=[0.45, 0.35, 0.15, 0.05]).tolist(), 6]
                          for p in ("w1", "w3", "w2")}}  # fmt: skip
    out = {}
    for name, widths in layouts.items():
        groups, tables = {}, {}
        for p, dims in (("w1", (d, inter)), ("w3", (d, inter)), ("w2", (inter, d))):
            groups[p] = [rand_group(device, *dims, b, gen) for b in widths[p]]
            tables[p] = ExpertTable.build(groups[p], layout="stack" if name == "stack4b" else "ragged")
        x = torch.randn(1, d, device=device, generator=gen).to(torch.bfloat16)
        id_sets = [
            torch.from_numpy(rng.choice(routed, size=(1, topk), replace=False)).to(device) for _ in range(16)
        ]
        wts = torch.rand(1, topk, device=device, generator=gen) + 0.05
        used = [*id_sets[0][0].tolist(), routed]
        dense = {p: [None] * (routed + 1) for p in groups}
        for p in groups:
            for e in used:
                dense[p][e] = exl3_decode(*groups[p][e], dtype=torch.float32)
        want = moe_reference(x, id_sets[0], wts, dense["w1"], dense["w3"], dense["w2"], swiglu_limit=10.0)
        t1, t3, t2 = tables["w1"], tables["w3"], tables["w2"]
        got = torch.full((1, d), float("nan"), dtype=torch.float32, device=device)
        moe_exl3(x, id_sets[0], wts, t1, t3, t2, out=got)
        err = rel_err(got, want.double())
        if err > 1e-4:
            raise RuntimeError(f"moe_exl3 {name}: error {err:.1e} against float64")
        nbytes = sum(groups[p][e][0].numel() * 2 + 2 * (d + inter) for p in groups for e in used)
        s = per_call(device, [partial(moe_exl3, x, ids, wts, t1, t3, t2) for ids in id_sets])
        out[name] = {
            "us": s * 1e6,
            "err": err,
            "bytes": nbytes,
            "gbps": nbytes / s / 1e9,
            "vs_copy": nbytes / s / 1e9 / copy,
        }
        print(f"[kernels] MoE {name}: {s * 1e6:,.1f} µs, {nbytes / s / 1e9:,.0f} GB/s ({out[name]['vs_copy']:.0%} of copy)",
              flush=True)  # fmt: skip
        del groups, tables, dense
    return out


def main() -> None:
    ap = c.parser(__doc__)
    ap.add_argument("--rows", default="1,4,16", help="rows of the GEMM, comma-separated (default: 1,4,16)")
    args = ap.parse_args()
    try:
        rows_list = [int(r) for r in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows takes comma-separated integers, got {args.rows!r}")
    device = c.pick_device(args.device)
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: kernels run on the host
    c.ensure_tfc()
    run = c.Run("kernels", "kernels.py", device, args.commit)
    copy = c.copy_gbps(device)
    l2 = L2_BYTES if device == "cuda" else 1 << 12
    run.data.update(copy_gbps=copy, gemm=gemm(device, rows_list, copy, l2), moe=moe(device, copy))
    limit = f"the HBM copy rate of the same run ({copy:,.0f} GB/s)"
    head = next((g for g in run.data["gemm"] if g["shape"] == "head_6b" and g["rows"] == 1), None)
    if head:
        run.metric("kernels.gemv_head_vs_copy", head["vs_copy"], "fraction", ">= 0.70",
                   f"{limit}; torch's bf16 GEMV {head['vs_bf16']:.2f}x slower; exllamav3 2.08 TB/s")  # fmt: skip
    for name, m in run.data["moe"].items():
        run.metric(f"kernels.moe_token_vs_copy.{name}", m["vs_copy"], "fraction", ">= 0.50", limit)
    run.finish(args.json and device == "cuda")
    if args.json and device != "cuda":
        print("(--json ignored on the CPU: the smoke's numbers are not figures)")


if __name__ == "__main__":
    main()
