"""EXL3 products for many rows through a scratch: each entry with rows decoded once a call, then tensor-core tiles.

The tile path (`exl3_rows._rows_kernel`) decodes an entry's weights again in every tile of rows, inside the
product's loop. Here a first kernel decodes W-hat of every entry that has rows once into an fp16 scratch
(exact: the codebooks' values are fp16) by the lane decode (kernels/exl3/lanes.py), storing each tile's
values as 16-column runs; a second multiplies the tiles' rows from it with the same operands as the tile path
(the rows' fp16 rotated input, fp32 sums over k in BK steps) and finishes them as the tiles do. A row is summed
over k in one order whatever rows share its tile or call, so its bits never depend on its neighbours or the row
count. The scratch holds `ScratchConfig.scratch_bytes` of entries at a time: a table of hundreds of experts takes
several rounds, each round's tiles skipping the entries outside it. Device work only: no host sync, whatever the
rows' entries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3.lanes import lane_tiles
from tfc.kernels.exl3.tl import finished


@dataclass(frozen=True)
class ScratchConfig:
    """Launch values of the scratch's decode and product (any of them gives the same bits)."""

    scratch_bytes: int = 2 << 30  # decoded entries held at once (one entry at least, whatever its size)
    decode_rows: int = 128  # k rows a decode program takes (a multiple of 16 * tile_rows)
    tile_rows: int = 2  # 16-row tile rows a decode step takes (x 8 tile columns x 32 lanes: its tensors')
    decode_warps: int = 4  # warps a decode program
    num_warps: int = 4  # warps a product program
    num_stages: int = 3  # software-pipelining stages of the product's k loop (the scratch's and rows' loads)


@triton.jit
def _decode_block(start, dst, cb, kb, nb, N, W: tl.constexpr, CB: tl.constexpr, TK: tl.constexpr,
                  KB: tl.constexpr):  # fmt: skip
    """W-hat rows kb * KB.. of column block nb (128 columns) of the entry at start, into dst ([k, N] fp16): the
    lane decode (kernels/exl3/lanes.py), each tile's values permuted to row-major and stored 16 columns a run."""
    tn = N // 16
    nw: tl.constexpr = W // 2  # int32 words a tile
    tt = tl.arange(0, TK * 8)
    r = tl.arange(0, 16)
    c = tl.arange(0, 16)
    rows = ((tt // 8) * 16)[:, None, None] + r[None, :, None]
    cols = (nb * 128 + (tt % 8) * 16)[:, None, None] + c[None, None, :]
    base = start + nb * 8 * nw + (kb * (KB // 16)) * tn * nw
    for kk in tl.static_range(0, KB, 16 * TK):
        v = lane_tiles(base + (kk // 16) * tn * nw, tn, cb, W, CB, TK)  # tile, tc, tr, ql, qh, qc
        v = tl.reshape(tl.permute(v, [0, 4, 2, 3, 5, 1]), [TK * 8, 16, 16])  # tile, (qh tr ql), (qc tc)
        tl.store(dst + (kb * KB + kk + rows).to(tl.int64) * N + cols, v)


@triton.jit
def _decode_entries_kernel(words_ptr, off_ptr, wid_ptr, cb_ptr, hit_ptr, out_ptr, e0, entries, N, K,
                           WIDTHS: tl.constexpr, CB: tl.constexpr, TK: tl.constexpr,
                           KB: tl.constexpr):  # fmt: skip
    """out[e - e0] = W-hat of entry e = e0 + program_id(1) (one KB x 128 block a program), if e has rows."""
    e = e0 + tl.program_id(1)
    blocks_n = N // 128
    kb = tl.program_id(0) // blocks_n
    nb = tl.program_id(0) % blocks_n
    hit = tl.load(hit_ptr + e, mask=e < entries, other=0)
    if hit > 0:
        cb = 0
        if CB < 0:
            cb = tl.load(cb_ptr + e)
        start = words_ptr + tl.load(off_ptr + e) // 4
        dst = out_ptr + tl.program_id(1).to(tl.int64) * K * N
        if len(WIDTHS) == 1:
            _decode_block(start, dst, cb, kb, nb, N, WIDTHS[0], CB, TK, KB)
        else:  # a ragged table: one branch per width it holds
            width = tl.load(wid_ptr + e)
            for i in tl.static_range(len(WIDTHS)):
                if width == WIDTHS[i]:
                    _decode_block(start, dst, cb, kb, nb, N, WIDTHS[i], CB, TK, KB)


@triton.jit
def _scratch_rows_kernel(xh_ptr, inv_ptr, w_ptr, y_ptr, tile_ptr, svh_ptr, e0, EB, N, K, stride_x, stride_y,
                         BM: tl.constexpr, BK: tl.constexpr, PER_ENTRY: tl.constexpr):  # fmt: skip
    """y[rows, block] = finished((xh[rows] @ W-hat_e[:, block]) * inv[rows]) for tile program_id(0), if its entry
    e is in this round's [e0, e0 + EB) (W-hat_e at w_ptr's entry e - e0; exl3_tl's `finished`)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(tile_ptr + 3 * pid_m)
    r0 = tl.load(tile_ptr + 3 * pid_m + 1)
    rn = tl.load(tile_ptr + 3 * pid_m + 2)
    if (rn > 0) & (e >= e0) & (e < e0 + EB):
        m = tl.arange(0, BM)
        live = m < rn
        rows = r0 + m
        cols = pid_n * 128 + tl.arange(0, 128)
        ks = tl.arange(0, BK)
        x_at = xh_ptr + rows[:, None].to(tl.int64) * stride_x + ks[None, :]
        w_at = w_ptr + (e - e0) * K * N + ks[:, None] * N + cols[None, :]
        acc = tl.zeros([BM, 128], dtype=tl.float32)
        for _ in range(0, K, BK):
            acc = tl.dot(tl.load(x_at, mask=live[:, None], other=0.0), tl.load(w_at), acc)
            x_at += BK
            w_at += BK * N
        acc = finished(acc * tl.load(inv_ptr + rows, mask=live, other=0.0)[:, None], svh_ptr, e, N, cols, BM,
                       PER_ENTRY)  # fmt: skip
        dst = y_ptr + rows[:, None].to(tl.int64) * stride_y + cols[None, :]
        tl.store(dst, acc, mask=live[:, None])


def entries_with_rows(tiles: torch.Tensor, entries: int) -> torch.Tensor:
    """int32 [entries]: the rows each entry has in tiles (int64 [T, 3]: entry, first row, rows)."""
    hit = torch.zeros(entries, dtype=torch.int32, device=tiles.device)
    return hit.index_add_(0, tiles[:, 0], tiles[:, 2].to(torch.int32))


def decode_round(words: torch.Tensor, offsets: torch.Tensor, widths: torch.Tensor, codebooks: torch.Tensor,
                 hit: torch.Tensor, scratch: torch.Tensor, e0: int, width_set: tuple[int, ...], codebook: int,
                 config: ScratchConfig = ScratchConfig()) -> None:  # fmt: skip
    """scratch[i] = W-hat of entry e0 + i, for the entries hit counts rows of (scratch fp16 [entries a round, k, n])."""
    per_round, k, n = scratch.shape
    entries = offsets.numel()
    _decode_entries_kernel[((k // config.decode_rows) * (n // 128), min(per_round, entries - e0))](
        words, offsets, widths, codebooks, hit, scratch, e0, entries, n, k, WIDTHS=tuple(width_set), CB=codebook,
        TK=config.tile_rows, KB=config.decode_rows, num_warps=config.decode_warps,
    )  # fmt: skip


def scratch_rows(xh: torch.Tensor, inv: torch.Tensor, words: torch.Tensor, offsets: torch.Tensor,
                 widths: torch.Tensor, codebooks: torch.Tensor, tiles: torch.Tensor, n: int,
                 width_set: tuple[int, ...], codebook: int, out: torch.Tensor, block_m: int, svh: torch.Tensor,
                 config: ScratchConfig = ScratchConfig()) -> None:  # fmt: skip
    """out[r] = finished((xh[r] @ W-hat_e) * inv[r]) for every row r of every tile (the output rotation and svh:
    [n], or [entries, n] one per entry): the entries with rows decoded config.scratch_bytes at a time, each
    round's tiles multiplied from the scratch."""
    k = xh.shape[1]
    entries = offsets.numel()
    if k % config.decode_rows:
        raise ValueError(f"k {k} must be a multiple of {config.decode_rows} for the scratch decode")
    per_round = max(1, min(entries, config.scratch_bytes // (2 * k * n)))
    scratch = torch.empty((per_round, k, n), dtype=torch.float16, device=xh.device)
    hit = entries_with_rows(tiles, entries)
    bk = 64 if k % 64 == 0 else 32
    for e0 in range(0, entries, per_round):
        decode_round(words, offsets, widths, codebooks, hit, scratch, e0, width_set, codebook, config)
        _scratch_rows_kernel[(tiles.shape[0], n // 128)](
            xh, inv, scratch, out, tiles, svh, e0, per_round, n, k, xh.stride(0), out.stride(0), BM=block_m, BK=bk,
            PER_ENTRY=svh.dim() == 2, num_warps=config.num_warps, num_stages=config.num_stages,
            enable_fp_fusion=False,
        )  # fmt: skip


__all__ = ["ScratchConfig", "decode_round", "entries_with_rows", "scratch_rows"]
