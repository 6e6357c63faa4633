"""The indexer's chunk scores as one Triton kernel (no torch.compile): the `@fused` stage `chunk_scores` of
runtime/models/dsv41/fast/compressed.py, a drop-in with its signature.

    chunk_scores(raw, q, weights, grid)   index_scores(q, unpack_fp4(raw), w)   fp32 [R, c]
    paged_scores(pool, pages, per_page, q, weights)   the same of the entries the rows' pages hold, read in place

Each entry's score is sum_h weights[h] * relu(q[h] . key) * d**-0.5 of its FP4 index key (decoded in the kernel)
and the row's FP4 queries. Bit for bit torch's: a 32-channel partial dot of FP4 values is exact in fp32 (TF32
products of 2-bit mantissas, sums of 13 bits at most), then the blocks and the heads add in fixed_sum's tree.
q must hold FP4 values (index_query's output): other values would lose bits to TF32. A program scores
`ScoresConfig.entries` entries of one row, so an entry's score depends on neither the chunk's width nor the other rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from tfc.kernels.dsv41.kv_pack import NO_FMA, unit_stride
from tfc.kernels.dsv41.stage_tl import e2m1_value, ue8m0_value

__all__ = ["ScoresConfig", "chunk_scores", "paged_scores"]


@dataclass(frozen=True)
class ScoresConfig:
    """Launch values of the scores (any of them gives the same bits)."""

    entries: int = 64  # entries a program scores (CJ)


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
                   H: tl.constexpr, CJ: tl.constexpr, pages_ptr=None, spr=0, per_page=1,
                   PAGED: tl.constexpr = False):  # fmt: skip
    """CJ entries of one row: sum_h w[h] * relu(q[h] . key) * scale, blocks and heads summed as fixed_sum. The
    entries are the row's raw[r, j], or (PAGED) pool rows pages[r, j // per_page] * per_page + j % per_page."""
    r = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1) * CJ + tl.arange(0, CJ)
    live = j < C
    if PAGED:
        page = tl.load(pages_ptr + r * spr + j // per_page, mask=live, other=0).to(tl.int64)
        entry = raw_ptr + (page * per_page + j % per_page) * src
    else:
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


def _check(q: torch.Tensor, weights: torch.Tensor, name: str) -> tuple[int, int, int]:
    """(rows, heads, d) of FP4 queries q [R, H, d] and their weights [R, H]; ValueError (one line) otherwise."""
    if q.dim() != 3 or q.dtype != torch.float32:
        raise ValueError(f"{name} q must be fp32 [R, H, d]; got {q.dtype} {tuple(q.shape)}")
    rows, heads, d = q.shape
    if d % 32 or d // 32 not in (1, 2, 4, 8) or heads not in (16, 32, 64, 128):
        raise ValueError(f"{name} takes d in 32, 64, 128, 256 and 16 to 128 heads; got {heads} x {d}")
    if weights.shape != (rows, heads):
        raise ValueError(f"{name} weights must be [{rows}, {heads}]; got {tuple(weights.shape)}")
    return rows, heads, d


def _launch(keys, q, weights, c: int, srr: int, src: int, paged: dict, config: ScoresConfig) -> torch.Tensor:
    """The scores [R, c] of the rows' c entries at keys (rows srr, entries src apart, or paged) by _scores_kernel."""
    rows, heads, d = q.shape
    out = torch.empty((rows, c), dtype=torch.float32, device=q.device)
    if rows and c:
        _scores_kernel[(rows, triton.cdiv(c, config.entries))](
            keys, q, weights, out, c, srr, src, q.stride(0), q.stride(1), weights.stride(0), d**-0.5, D=d, H=heads,
            CJ=config.entries, num_warps=4, **paged, **NO_FMA,
        )  # fmt: skip
    return out


def chunk_scores(raw: torch.Tensor, q: torch.Tensor, weights: torch.Tensor, grid,
                 config: ScoresConfig = ScoresConfig()) -> torch.Tensor:  # fmt: skip
    """Scores fp32 [R, c] of index key rows raw uint8 [R, c, d/2 + d/32] against FP4 queries q [R, H, d]."""
    rows, _, d = _check(q, weights, "chunk_scores")
    if raw.dim() != 3 or raw.dtype != torch.uint8 or raw.shape[0] != rows or raw.shape[2] != d // 2 + d // 32:
        raise ValueError(f"chunk_scores raw {tuple(raw.shape)} must be uint8 [{rows}, c, {d // 2 + d // 32}]")
    raw, q, weights = unit_stride(raw), unit_stride(q), unit_stride(weights)
    return _launch(raw, q, weights, raw.shape[1], raw.stride(0), raw.stride(1), {}, config)


def paged_scores(pool: torch.Tensor, pages: torch.Tensor, per_page: int, q: torch.Tensor,
                 weights: torch.Tensor, config: ScoresConfig = ScoresConfig()) -> torch.Tensor:  # fmt: skip
    """chunk_scores of every entry the rows' pages hold, read where they lie: row r's entry j is pool row
    pages[r, j // per_page] * per_page + j % per_page (pool uint8 [N, d/2 + d/32]); fp32 [R, pages * per_page],
    the bits of chunk_scores on those rows gathered first."""
    rows, _, d = _check(q, weights, "paged_scores")
    if pool.dim() != 2 or pool.dtype != torch.uint8 or pool.shape[1] != d // 2 + d // 32:
        raise ValueError(f"paged_scores pool {tuple(pool.shape)} must be uint8 [N, {d // 2 + d // 32}]")
    ok_pages = pages.dim() == 2 and pages.shape[0] == rows and pages.dtype in (torch.int32, torch.int64)
    if not ok_pages or per_page < 1:
        raise ValueError(f"paged_scores pages must be int [{rows}, P] with per_page >= 1; got "
                         f"{pages.dtype} {tuple(pages.shape)}, {per_page}")  # fmt: skip
    pool, pages, q, weights = unit_stride(pool), unit_stride(pages), unit_stride(q), unit_stride(weights)
    paged = {"pages_ptr": pages, "spr": pages.stride(0), "per_page": per_page, "PAGED": True}
    return _launch(pool, q, weights, pages.shape[1] * per_page, 0, pool.stride(0), paged, config)
