"""The EXL3 GEMM's k-split partial sums (kernels/exl3/gemv.py): each sums a column block's partials in split
order, so results never depend on scheduling, then takes the output Hadamard and svh. In the product's own
launch, by the last program of a column block to arrive (`reduce_last`); in a second launch, one program per
(column block, row[, group]) (`reduce_kernel`); or as fixed-point words a row-parallel rank all-reduces
(`fixed_reduce_kernel`). Rows from LIVE on come back as zeros, their partials never read."""

from __future__ import annotations

import triton
import triton.language as tl
from tfc.kernels.exl3.fixed import fixed_words
from tfc.kernels.exl3.tl import fwht128, release_fence, rotate_sum


@triton.jit
def reduce_last(cnt_ptr, svh_ptr, y_ptr, block, pid_n, cols, M, stride_y, SPLIT, MP: tl.constexpr,
                BY_ROW: tl.constexpr, LIVE):  # fmt: skip
    """The last program of a column block to arrive sums its SPLIT partials, rotates, scales, stores (rows from
    LIVE on: zeros)."""
    m = tl.arange(0, MP)
    release_fence()
    last = pid_n >= 0
    if SPLIT > 1:
        last = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu") == SPLIT - 1
    if last:
        if BY_ROW:
            # Row by row (rows < M only): the one-row sum keeps 8 partials in flight and needs no
            # [MP, 32, 128] product (nor its registers, which would cap the mma loop's occupancy).
            sv = tl.load(svh_ptr + cols).to(tl.float32)
            for r in range(M):
                if r < LIVE:
                    y = rotate_sum(block + r * 128, SPLIT, MP * 128, 128, 1) * sv
                else:
                    y = tl.zeros([1, 128], tl.float32)
                tl.store(y_ptr + r * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty))
        else:
            y = rotate_sum(block, SPLIT, MP * 128, 128, MP) * tl.load(svh_ptr + cols).to(tl.float32)[None, :]
            y = tl.where(m[:, None] < LIVE, y, 0.0)
            tl.store(
                y_ptr + m[:, None] * stride_y + cols[None, :],
                y.to(y_ptr.dtype.element_ty),
                mask=m[:, None] < M,
            )
        if SPLIT > 1:
            tl.atomic_xchg(cnt_ptr + pid_n, 0)


@triton.jit
def reduce_kernel(ws_ptr, svh_ptr, y_ptr, stride_y, SPLIT, LIVE, MP: tl.constexpr, FLIGHT: tl.constexpr = 8,
                  goff_ptr=None, N=0, GROUPED: tl.constexpr = False):  # fmt: skip
    """y[row, block] = had128(sum of the block's SPLIT partials of that row) * svh: one program per (block, row),
    FLIGHT partials loaded at a time (rows from LIVE on: zeros, nothing read); GROUPED: per (block, row, group)
    as in the GEMM kernel (exl3_gemv)."""
    pid_n = tl.program_id(0)
    r = tl.program_id(1)
    if GROUPED:
        g = tl.program_id(2)
        ws_ptr += g * tl.num_programs(0) * SPLIT * (MP * 128)
        svh_ptr += tl.load(goff_ptr + 2 * tl.num_programs(2) + g)
        y_ptr += g * N
    cols = pid_n * 128 + tl.arange(0, 128)
    src = ws_ptr + pid_n * SPLIT * (MP * 128) + r * 128
    if r < LIVE:
        y = rotate_sum(src, SPLIT, MP * 128, 128, 1, FLIGHT) * tl.load(svh_ptr + cols).to(tl.float32)
    else:
        y = tl.zeros([1, 128], tl.float32)
    tl.store(y_ptr + r * stride_y + cols[None, :], y.to(y_ptr.dtype.element_ty))


@triton.jit
def fixed_reduce_kernel(ws_ptr, svh_ptr, acc_ptr, M, N, SPLIT, MP: tl.constexpr):
    """acc[:, row, block] = the fixed-point words of had128(partial) * svh summed over the block's SPLIT partials
    (one 128-row block of k each): one program per (block, row)."""
    pid_n = tl.program_id(0)
    r = tl.program_id(1)
    cols = pid_n * 128 + tl.arange(0, 128)
    src = ws_ptr + pid_n * SPLIT * (MP * 128) + r * 128
    sv = tl.load(svh_ptr + cols).to(tl.float32) * 0.08838834764831845
    hi = tl.zeros([128], dtype=tl.int64)
    lo = tl.zeros([128], dtype=tl.int64)
    for s in range(SPLIT):
        h, q = fixed_words(fwht128(tl.load(src + s * (MP * 128) + tl.arange(0, 128))) * sv)
        hi += h
        lo += q
    tl.store(acc_ptr + r * N + cols, hi)
    tl.store(acc_ptr + (M + r) * N + cols, lo)


__all__ = ["fixed_reduce_kernel", "reduce_kernel", "reduce_last"]
