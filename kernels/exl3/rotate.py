"""The many-row products' input rotation: each row times suh, had128 / sqrt(128) in fp32, then scaled by a per-row
power of two and rounded to fp16 (kernels/exl3/rows.py multiplies it; `rows_seen` gives the rows a product so
multiplies).

`rotated_rows` runs it as one Triton program a row on a GPU (`rotate_rows`, fp contraction off, so its bits are
the torch path's) and as torch ops elsewhere; the MoE's gathered rows and per-expert signs are read in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3.tl import rotated128

# A row is scaled by a power of two that brings its largest value to [2^14, 2^15) before it is rounded to fp16, so
# it never overflows fp16 and its small values stay clear of fp16's subnormals.
ROW_TOP = 14


def scaled_fp16(xh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 rows [M, k] as (fp16 [M, k]: each row times 2^s, rounded; fp32 [M]: 2^-s, what the sums are scaled back
    by). Exact scaling: a row's bits depend on it alone."""
    amax = xh.abs().amax(dim=1).clamp(min=2.0**-100)
    _, e = torch.frexp(amax)  # amax = m 2^e, m in [0.5, 1): floor(log2 amax) = e - 1, exactly
    scale = ((ROW_TOP + 1 - e.int() + 127) << 23).view(torch.float32)
    return (xh * scale[:, None]).to(torch.float16), 1.0 / scale


def fwht128_rows(x: torch.Tensor) -> torch.Tensor:
    """x [M, k] fp32 @ blockdiag(H128) / sqrt(128), by seven butterfly stages (elementwise: a row's bits never
    depend on the other rows, as a matrix product's blocking could make them)."""
    m, k = x.shape
    v = x.reshape(m * (k // 128), 128)
    for half in (64, 32, 16, 8, 4, 2, 1):
        v = v.view(-1, 128 // (2 * half), 2, half)
        a, b = v[:, :, 0], v[:, :, 1]
        v = torch.stack((a + b, a - b), dim=2)
    return v.reshape(m, k) * 0.08838834764831845


@triton.jit
def _rotate_rows_kernel(x_ptr, suh_ptr, src_ptr, ent_ptr, xh_ptr, inv_ptr, K, stride_x, stride_suh,
                        TOP: tl.constexpr, GATHER_X: tl.constexpr, GATHER_SUH: tl.constexpr):  # fmt: skip
    """rotated_rows for row program_id(0) (of x's row src[row] with GATHER_X, suh's row ent[row] with
    GATHER_SUH): its rotation's largest magnitude, then its scaled fp16 row."""
    row = tl.program_id(0).to(tl.int64)
    x_at = tl.load(src_ptr + row).to(tl.int64) if GATHER_X else row
    suh_at = tl.load(ent_ptr + row).to(tl.int64) if GATHER_SUH else row
    x_row, suh_row, out = x_ptr + x_at * stride_x, suh_ptr + suh_at * stride_suh, xh_ptr + row * K
    amax = tl.zeros([128], dtype=tl.float32)
    for k0 in range(0, K, 128):
        amax = tl.maximum(amax, tl.abs(rotated128(x_row, suh_row, k0)))
    e = ((tl.maximum(tl.max(amax, axis=0), 2.0**-100).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    scale = ((TOP - e + 127) << 23).to(tl.float32, bitcast=True)
    tl.store(inv_ptr + row, ((e - TOP + 127) << 23).to(tl.float32, bitcast=True))
    i = tl.arange(0, 128)
    for k0 in range(0, K, 128):
        tl.store(out + k0 + i, (rotated128(x_row, suh_row, k0) * scale).to(tl.float16))


def rotate_rows(x: torch.Tensor, suh: torch.Tensor, rows: torch.Tensor | None = None,
                entries: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """rotated_rows in one Triton kernel a row (no fp contraction, so the bits are the torch path's), the
    gathers of rows / entries read in place."""
    k = x.shape[1]
    m = x.shape[0] if rows is None else rows.numel()
    if k % 128 or suh.shape[-1] != k:
        raise ValueError(f"x {tuple(x.shape)} and suh {tuple(suh.shape)} must share k, a multiple of 128")
    x, suh = x.contiguous(), suh.contiguous()
    xh = torch.empty((m, k), dtype=torch.float16, device=x.device)
    inv = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        src = x if rows is None else rows.contiguous()
        ent = x if entries is None else entries.contiguous()
        _rotate_rows_kernel[(m,)](x, suh, src, ent, xh, inv, k, x.stride(0), k if suh.dim() == 2 else 0,
                                  TOP=ROW_TOP, GATHER_X=rows is not None, GATHER_SUH=entries is not None,
                                  num_warps=1, enable_fp_fusion=False)  # fmt: skip
    return xh, inv


def rotated_rows(x: torch.Tensor, suh: torch.Tensor, rows: torch.Tensor | None = None,
                 entries: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """scaled_fp16 of had128(x * suh) (suh [k], or [M, k]: one per row), the rotation in fp32; with rows, of
    x[rows] (row r's x is x[rows[r]]), and with entries, each row's suh is suh[entries[r]] (suh [E, k]); one kernel
    a row on a GPU, torch's ops elsewhere (the same bits)."""
    if x.is_cuda:
        return rotate_rows(x, suh, rows, entries)
    xs = x if rows is None else x[rows]
    return scaled_fp16(fwht128_rows(xs.float() * (suh if entries is None else suh[entries]).float()))


def rows_seen(x: torch.Tensor, suh: torch.Tensor) -> torch.Tensor:
    """The rows a product on rotated_rows(x, suh) multiplies: the rows its fp16 values stand for (the rotation is
    orthonormal and its own inverse: undone on them)."""
    xh, inv = rotated_rows(x, suh)
    return fwht128_rows(xh.float() * inv[:, None]) / suh.float()


__all__ = ["ROW_TOP", "fwht128_rows", "rotate_rows", "rotated_rows", "rows_seen", "scaled_fp16"]
