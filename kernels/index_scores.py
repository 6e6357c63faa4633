"""The indexer's chunk scores as one Triton kernel (no torch.compile): the `@fused` stage `chunk_scores` of
runtime/models/dsv41/fast/compressed.py, a drop-in with its signature.

    chunk_scores(raw, q, weights, grid)   index_scores(q, unpack_fp4(raw), w)   fp32 [R, c]

Each entry's score is sum_h weights[h] * relu(q[h] . key) * d**-0.5 of its FP4 index key (decoded in the kernel)
and the row's FP4 queries. Bit for bit torch's: a 32-channel partial dot of FP4 values is exact in fp32 (TF32
products of 2-bit mantissas, sums of 13 bits at most), then the blocks and the heads add in fixed_sum's tree.
q must hold FP4 values (index_query's output): other values would lose bits to TF32. A program scores ENTRIES
entries of one row, so an entry's score depends on neither the chunk's width nor the other rows.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from tfc.kernels.kv_pack import NO_FMA, unit_stride
from tfc.kernels.stage_tl import e2m1_value, ue8m0_value

__all__ = ["ENTRIES", "chunk_scores"]

ENTRIES = 64  # entries a program scores (CJ)


@triton.jit
def _part(entry, live, q_row, sqh, b: tl.constexpr, D: tl.constexpr, H: tl.constexpr):
    """[CJ, H]: the exact dots of the entries' 32-channel block b with every head's query block b."""
    m = tl.arange(0, 16)
    byte = tl.load(entry[:, None] + (b * 16 + m)[None, :], mask=live[:, None], other=0).to(tl.int32)
    q = q_row + tl.arange(0, H)[None, :] * sqh + (b * 32 + 2 * m)[:, None]
    acc = tl.dot(e2m1_value(byte & 15), tl.load(q), input_precision="tf32")
    acc = tl.dot(e2m1_value(byte >> 4), tl.load(q + 1), acc, input_precision="tf32")
    scale = ue8m0_value(tl.load(entry + D // 2 + b, mask=live, other=0).to(tl.int32))
    return acc * scale[:, None]


@triton.jit
def _halve(t, CJ: tl.constexpr, S: tl.constexpr):
    """[CJ, S] -> [CJ, S / 2]: the first half of the columns plus the second (a step of fixed_sum's tree)."""
    return tl.sum(tl.reshape(t, [CJ, 2, S // 2]), axis=1)


@triton.jit
def _scores_kernel(raw_ptr, q_ptr, w_ptr, out_ptr, C, srr, src, sqr, sqh, swr, scale, D: tl.constexpr,
                   H: tl.constexpr, CJ: tl.constexpr):  # fmt: skip
    """CJ entries of one row: sum_h w[h] * relu(q[h] . key) * scale, blocks and heads summed as fixed_sum."""
    r = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * CJ + tl.arange(0, CJ)
    live = j < C
    entry = raw_ptr + r * srr + j.to(tl.int64) * src
    q_row = q_ptr + r * sqr
    NB: tl.constexpr = D // 32
    if NB == 1:
        dots = _part(entry, live, q_row, sqh, 0, D, H)
    elif NB == 2:
        dots = _part(entry, live, q_row, sqh, 0, D, H) + _part(entry, live, q_row, sqh, 1, D, H)
    elif NB == 4:
        dots = (_part(entry, live, q_row, sqh, 0, D, H) + _part(entry, live, q_row, sqh, 2, D, H)) + (
            _part(entry, live, q_row, sqh, 1, D, H) + _part(entry, live, q_row, sqh, 3, D, H)
        )
    else:
        dots = (
            (_part(entry, live, q_row, sqh, 0, D, H) + _part(entry, live, q_row, sqh, 4, D, H))
            + (_part(entry, live, q_row, sqh, 2, D, H) + _part(entry, live, q_row, sqh, 6, D, H))
        ) + (
            (_part(entry, live, q_row, sqh, 1, D, H) + _part(entry, live, q_row, sqh, 5, D, H))
            + (_part(entry, live, q_row, sqh, 3, D, H) + _part(entry, live, q_row, sqh, 7, D, H))
        )
    w = tl.load(w_ptr + r * swr + tl.arange(0, H)).to(tl.float32)
    t = (tl.maximum(dots, 0.0) * scale) * w[None, :]
    t = _halve(t, CJ, H)
    t = _halve(t, CJ, H // 2)
    t = _halve(t, CJ, H // 4)
    t = _halve(t, CJ, H // 8)
    if H >= 32:
        t = _halve(t, CJ, H // 16)
    if H >= 64:
        t = _halve(t, CJ, H // 32)
    if H >= 128:
        t = _halve(t, CJ, H // 64)
    tl.store(out_ptr + r * C + j, tl.reshape(t, [CJ]), mask=live)


def chunk_scores(raw: torch.Tensor, q: torch.Tensor, weights: torch.Tensor, grid) -> torch.Tensor:
    """Scores fp32 [R, c] of index key rows raw uint8 [R, c, d/2 + d/32] against FP4 queries q [R, H, d]."""
    if q.dim() != 3 or q.dtype != torch.float32:
        raise ValueError(f"chunk_scores q must be fp32 [R, H, d]; got {q.dtype} {tuple(q.shape)}")
    rows, heads, d = q.shape
    if d % 32 or d // 32 not in (1, 2, 4, 8) or heads not in (16, 32, 64, 128):
        raise ValueError(f"chunk_scores takes d in 32, 64, 128, 256 and 16 to 128 heads; got {heads} x {d}")
    if raw.dim() != 3 or raw.dtype != torch.uint8 or raw.shape[0] != rows or raw.shape[2] != d // 2 + d // 32:
        raise ValueError(f"chunk_scores raw {tuple(raw.shape)} must be uint8 [{rows}, c, {d // 2 + d // 32}]")
    if weights.shape != (rows, heads):
        raise ValueError(f"chunk_scores weights must be [{rows}, {heads}]; got {tuple(weights.shape)}")
    raw, q, weights = unit_stride(raw), unit_stride(q), unit_stride(weights)
    c = raw.shape[1]
    out = torch.empty((rows, c), dtype=torch.float32, device=q.device)
    if rows and c:
        launch = (rows, triton.cdiv(c, ENTRIES))
        _scores_kernel[launch](raw, q, weights, out, c, raw.stride(0), raw.stride(1), q.stride(0),
                               q.stride(1), weights.stride(0), d**-0.5, D=d, H=heads, CJ=ENTRIES, num_warps=4,
                               **NO_FMA)  # fmt: skip
    return out
