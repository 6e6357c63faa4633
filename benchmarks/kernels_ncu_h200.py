#!/usr/bin/env python3
"""One EXL3 kernel workload at a Flash shape, launched a few times for Nsight Compute to profile.

    ncu --clock-control none -k regex:exl3_gemm --launch-skip 2 --launch-count 1 \
        python3 benchmarks/kernels_ncu_h200.py gemv_head_6b
`benchmarks/h200_ncu.sh` runs every workload this way, with the pipe, issue and stall metrics, and dumps the
SASS of each compiled kernel (its own Triton cache per workload).
"""

from __future__ import annotations

import argparse

# name: (k, n, bits, rows)
GEMV = {
    "gemv_head_6b": (5120, 129280, 6, 1),
    "gemv_wob_4b": (8192, 5120, 4, 1),
    "gemv_w2_4b": (2304, 5120, 4, 1),
    "gemv_w1_2b": (5120, 2304, 2, 1),
    "gemm4_wqb_4b": (1280, 32768, 4, 4),
    "gemm16_wqb_4b": (1280, 32768, 4, 16),
}
WORKLOADS = [*GEMV, "moe_stack_4b"]


def run(name: str, launches: int = 4) -> None:
    """Launch workload `name` `launches` times (the first compiles)."""
    import kernels_h200 as kb  # the benchmark's shim import, shapes and random groups
    import torch

    gen = torch.Generator(device=kb.DEV).manual_seed(7)
    if name in GEMV:
        k, n, bits, rows = GEMV[name]
        tr, suh, svh, cb = kb.rand_group(k, n, bits, 2, gen)
        x = torch.randn(rows, k, device=kb.DEV, generator=gen).to(torch.bfloat16)
        for _ in range(launches):
            kb.exl3_gemm(x, tr, suh, svh, cb)
    else:
        d, inter, routed, topk = kb.MOE_DIMS
        tables = {
            p: kb.ExpertTable.build(
                [kb.rand_group(*dims, 4, 2, gen) for _ in range(routed + 1)], layout="stack"
            )
            for p, dims in (("w1", (d, inter)), ("w3", (d, inter)), ("w2", (inter, d)))
        }
        x = torch.randn(1, d, device=kb.DEV, generator=gen).to(torch.bfloat16)
        ids = torch.randperm(routed, device=kb.DEV, generator=gen)[:topk].view(1, topk)
        wts = torch.rand(1, topk, device=kb.DEV, generator=gen) + 0.05
        for _ in range(launches):
            kb.moe_exl3(x, ids, wts, tables["w1"], tables["w3"], tables["w2"])
    torch.cuda.synchronize()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("workload", choices=WORKLOADS)
    run(ap.parse_args().workload)
