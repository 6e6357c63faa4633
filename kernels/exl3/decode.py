"""Triton EXL3 decode to a dense fp16/bf16/fp32 weight W [k, n] (for prefill through cuBLAS, and tests)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3.tl import cb_decode, hadamard_block, load_states, tile_positions, window_offsets


@triton.jit
def _decode_kernel(
    t_ptr,
    suh_ptr,
    svh_ptr,
    out_ptr,
    N,
    W: tl.constexpr,
    CB: tl.constexpr,
    ROTATED: tl.constexpr,
    BK: tl.constexpr,
):
    """One 128x128 block: W-hat decoded BK rows at a time, then H128 on both sides (fp32) and the scales."""
    pid_k = tl.program_id(0)
    pid_n = tl.program_id(1)
    tn = N // 16
    nw: tl.constexpr = W // 2
    pos = tile_positions(BK, 128)
    off_j, off_jp, shift = window_offsets(pos, W, tn, BK, 128)
    rows = tl.arange(0, 128)
    cols = pid_n * 128 + tl.arange(0, 128)
    base = t_ptr + (pid_k * 8 * tn + pid_n * 8).to(tl.int64) * nw
    if ROTATED:
        for kk in tl.static_range(0, 128, BK):
            v = cb_decode(load_states(base + (kk // 16) * tn * nw, off_j, off_jp, shift), CB)
            r = pid_k * 128 + kk + tl.arange(0, BK)
            tl.store(out_ptr + r[:, None].to(tl.int64) * N + cols[None, :], v.to(out_ptr.dtype.element_ty))
    else:
        acc = tl.zeros([128, 128], dtype=tl.float32)
        for kk in tl.static_range(0, 128, BK):
            v = cb_decode(load_states(base + (kk // 16) * tn * nw, off_j, off_jp, shift), CB)
            # H entries are ±1 and W-hat is fp16: the fp16 product with fp32 accumulation is exact.
            h = hadamard_block(128, BK, 0, kk).to(tl.float16)
            acc = tl.dot(h, v, acc)
        acc = tl.dot(acc, hadamard_block(128, 128, 0, 0), input_precision="tf32x3")
        su = tl.load(suh_ptr + pid_k * 128 + rows).to(tl.float32) * (1.0 / 128.0)
        sv = tl.load(svh_ptr + cols).to(tl.float32)
        w = acc * su[:, None] * sv[None, :]
        r = pid_k * 128 + rows
        tl.store(out_ptr + r[:, None].to(tl.int64) * N + cols[None, :], w.to(out_ptr.dtype.element_ty))


def exl3_decode(
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: int,
    dtype: torch.dtype = torch.float16,
    rotated: bool = False,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Dense W [k, n] = diag(suh) Hk W-hat Hn diag(svh) in `dtype`; `rotated=True` gives W-hat itself."""
    tk, tn, width = trellis.shape
    k, n = 16 * tk, 16 * tn
    if out is None:
        out = torch.empty((k, n), dtype=dtype, device=trellis.device)
    if tuple(out.shape) != (k, n) or not out.is_contiguous():
        raise ValueError(f"out must be a contiguous [{k}, {n}] tensor")
    _decode_kernel[(k // 128, n // 128)](
        trellis.view(torch.int32), suh, svh, out, n, W=width, CB=codebook, ROTATED=rotated, BK=32, num_warps=8
    )
    return out
