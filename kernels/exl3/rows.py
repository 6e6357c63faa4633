"""EXL3 products for many rows (prefill): tiles of BM rows of one table entry on the matrix units, decoded once.

One program takes BM rows that share an EXL3 entry (a whole linear, or one expert of an expert table) and one
128-column block: it decodes W-hat BK rows at a time in registers by the lane decode of kernels/exl3/lanes.py,
each step's words and rows loaded a step ahead, and multiplies the rows' rotated input (kernels/exl3/rotate.py:
the fp32 rotation rounded to fp16 after a per-row power of two) into fp32; the tile then applies the output H128
(seven fp32 butterfly stages a row block) and svh before it stores. Every row is summed over k in the same order
whatever rows share its tile or launch, so a row's bits never depend on its neighbours or on the row count. The
tile list (entry, first row, rows) is built on the device (`expert_tiles`: no host sync, so a step using it can be
captured); tiles with no rows return at once.

`exl3_gemm_rows` is y = x @ W for a linear, through kernels/exl3/scratch.py (decoded once a call, not once a
tile; the rotation, the tiles' sums and the finish are the tiles'); `moe_rows` the clamped-SwiGLU MoE over expert
tables with the pairs grouped by expert (the routed pairs, then each token's shared expert), summed per token in
slot order, on the tiles (an expert of ~32 rows is decoded once anyway), or through the scratch in prefill steps
of `RowsConfig.moe_scratch_tokens` rows or more (`moe_scratch`). The launch values are `RowsConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from tfc.kernels.exl3.expert_table import ExpertTable
from tfc.kernels.exl3.lanes import as_block, lane_cut, lane_words
from tfc.kernels.exl3.rotate import fwht128_rows, rotate_rows, rotated_rows, scaled_fp16
from tfc.kernels.exl3.scratch import ScratchConfig, scratch_rows
from tfc.kernels.exl3.tl import finished


@dataclass(frozen=True)
class RowsConfig:
    """Launch values of the many-row products (block_k changes a row's summation order; the others do not)."""

    block_m: int = 64  # rows a program (a tile) takes
    block_k: int = 64  # k rows decoded per loop iteration (32 where k is not a multiple of it)
    num_warps: int = 4  # warps a program
    num_stages: int = 1  # software-pipelining stages of the k loop
    # A register cap per thread: at 168 three programs of the tiles fit an SM, where the compiler's own choice
    # (None) fits two; the same instructions, so the same bits.
    max_regs: int | None = 168
    # The MoE's tables take the scratch in prefill steps of this many rows or more (enough rows an expert that
    # its tiles would decode it several times).
    moe_scratch_tokens: int = 8192
    scratch: ScratchConfig = field(default_factory=ScratchConfig)


@triton.jit
def _entry_sums(xh_ptr, base, cb, N, K, rows, live, stride_x, W: tl.constexpr, CB: tl.constexpr,
                BM: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """fp32 [BM, 128]: the rows' rotated fp16 input at xh times W-hat's column block at base (width W), summed
    over k in BK steps, each step's words and rows loaded one step ahead, in registers."""
    tn = N // 16
    TK: tl.constexpr = BK // 16
    step = TK * tn * (W // 2)
    ks = tl.arange(0, BK)
    x_rows = xh_ptr + rows[:, None].to(tl.int64) * stride_x
    acc = tl.zeros([BM, 128], dtype=tl.float32)
    w0, w1, w2, w3 = lane_words(base, tn, W, TK)
    x = tl.load(x_rows + ks[None, :], mask=live[:, None], other=0.0)
    for k0 in range(0, K, BK):
        # the next step's loads (the last step's again after the last: valid addresses, never used)
        k_next = tl.where(k0 + BK < K, k0 + BK, k0)
        n0, n1, n2, n3 = lane_words(base + (k_next - k0) // BK * step, tn, W, TK)
        base += step
        n_x = tl.load(x_rows + (k_next + ks)[None, :], mask=live[:, None], other=0.0)
        acc = tl.dot(x, as_block(lane_cut(w0, w1, w2, w3, cb, W, CB, TK), TK), acc)
        w0, w1, w2, w3, x = n0, n1, n2, n3, n_x
    return acc


@triton.jit
def _rows_kernel(xh_ptr, inv_ptr, words_ptr, off_ptr, wid_ptr, cb_ptr, y_ptr, tile_ptr, svh_ptr, N, K, stride_x,
                 stride_y, WIDTHS: tl.constexpr, CB: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                 PER_ENTRY: tl.constexpr):  # fmt: skip
    """y[rows, block] = finished((xh[rows] @ W-hat_e[:, block]) * inv[rows]) for tile program_id(0)'s rows (the
    output rotation and svh: exl3_tl's `finished`)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(tile_ptr + 3 * pid_m).to(tl.int32)
    r0 = tl.load(tile_ptr + 3 * pid_m + 1)
    rn = tl.load(tile_ptr + 3 * pid_m + 2)
    if rn > 0:
        m = tl.arange(0, BM)
        live = m < rn
        rows = r0 + m
        cb = 0
        if CB < 0:
            cb = tl.load(cb_ptr + e)
        start = words_ptr + tl.load(off_ptr + e) // 4
        acc = tl.zeros([BM, 128], dtype=tl.float32)
        if len(WIDTHS) == 1:
            acc = _entry_sums(xh_ptr, start + pid_n * 8 * (WIDTHS[0] // 2), cb, N, K, rows, live, stride_x,
                              WIDTHS[0], CB, BM, BK)  # fmt: skip
        else:  # a ragged table: one branch per width it holds
            width = tl.load(wid_ptr + e)
            for i in tl.static_range(len(WIDTHS)):
                if width == WIDTHS[i]:
                    acc = _entry_sums(xh_ptr, start + pid_n * 8 * (WIDTHS[i] // 2), cb, N, K, rows, live,
                                      stride_x, WIDTHS[i], CB, BM, BK)  # fmt: skip
        acc = acc * tl.load(inv_ptr + rows, mask=live, other=0.0)[:, None]
        cols = pid_n * 128 + tl.arange(0, 128)
        acc = finished(acc, svh_ptr, e, N, cols, BM, PER_ENTRY)
        dst = y_ptr + rows[:, None].to(tl.int64) * stride_y + cols[None, :]
        tl.store(dst, acc, mask=live[:, None])


def launch_rows(rotated: tuple[torch.Tensor, torch.Tensor], words: torch.Tensor, offsets: torch.Tensor,
                widths: torch.Tensor, codebooks: torch.Tensor, svh: torch.Tensor, tiles: torch.Tensor, n: int,
                width_set: tuple[int, ...], codebook: int, out: torch.Tensor, scratch: bool = False,
                config: RowsConfig = RowsConfig()) -> torch.Tensor:  # fmt: skip
    """out[r] for every row r of every tile (tiles int64 [T, 3]: entry, first row, rows, as `expert_tiles` makes
    them with config.block_m); rotated: rotated_rows' (fp16 [M, k], fp32 [M]); svh [n] (one linear), or
    [entries, n]; `scratch`: through the decoded scratch, else decoding in each tile."""
    xh, inv = rotated
    m, k = xh.shape
    if xh.dtype != torch.float16 or not xh.is_contiguous():
        raise ValueError(f"xh must be contiguous [M, k] fp16, not {tuple(xh.shape)} {xh.dtype}")
    bk = config.block_k if k % config.block_k == 0 else 32
    if k % bk or n % 128 or tuple(out.shape) != (m, n) or out.stride(1) != 1:
        raise ValueError(f"shapes do not fit: xh {tuple(xh.shape)}, n {n}, out {tuple(out.shape)}")
    if tiles.numel() and m:
        if scratch:
            scratch_rows(xh, inv, words, offsets, widths, codebooks, tiles.contiguous(), n, width_set, codebook,
                         out, config.block_m, svh, config.scratch)  # fmt: skip
        else:
            _rows_kernel[(tiles.shape[0], n // 128)](
                xh, inv, words, offsets, widths, codebooks, out, tiles.contiguous(), svh, n, k, k, out.stride(0),
                WIDTHS=tuple(width_set), CB=codebook, BM=config.block_m, BK=bk, PER_ENTRY=svh.dim() == 2,
                num_warps=config.num_warps, num_stages=config.num_stages, enable_fp_fusion=False,
                **({} if config.max_regs is None else {"maxnreg": config.max_regs}),
            )  # fmt: skip
    return out


def dense_tiles(rows: int, device: torch.device, block_m: int = RowsConfig.block_m) -> torch.Tensor:
    """Tiles of entry 0 covering rows [0, rows), block_m at a time."""
    r0 = torch.arange(0, rows, block_m, device=device)
    return torch.stack((torch.zeros_like(r0), r0, (rows - r0).clamp(max=block_m)), dim=1)


def exl3_gemm_rows(x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook: int,
                   out: torch.Tensor | None = None, config: RowsConfig = RowsConfig()) -> torch.Tensor:  # fmt: skip
    """fp32 y [M, n] = x [M, k] @ W for an EXL3 group (trellis int16 [k/16, n/16, W]), any number of rows, through
    the decoded scratch."""
    tk, tn, width = trellis.shape
    k, n = 16 * tk, 16 * tn
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x {tuple(x.shape)} must be [M, {k}]")
    dev = x.device
    y = out if out is not None else torch.empty((x.shape[0], n), dtype=torch.float32, device=dev)
    one = torch.zeros(1, dtype=torch.int64, device=dev)
    return launch_rows(rotated_rows(x, suh), trellis.contiguous().view(torch.int32).reshape(-1), one,
                       torch.full((1,), width, dtype=torch.int32, device=dev), one.int() + codebook, svh,
                       dense_tiles(x.shape[0], dev, config.block_m), n, (width,), codebook, y, scratch=True,
                       config=config)  # fmt: skip


def expert_tiles(entries: torch.Tensor, count: int, block_m: int = RowsConfig.block_m) -> torch.Tensor:
    """Tiles [ceil(P / block_m) + count, 3] (entry, first row, rows) over pairs sorted by entry (entries [P],
    ascending, each < count): each entry's rows block_m at a time, then empty tiles. Device ops only."""
    dev = entries.device
    counts = torch.zeros(count, dtype=torch.int64, device=dev).scatter_add_(
        0, entries, torch.ones_like(entries)
    )
    first_row = torch.cumsum(counts, 0) - counts
    per = torch.div(counts + block_m - 1, block_m, rounding_mode="floor")
    ends = torch.cumsum(per, 0)
    slots = -(-entries.numel() // block_m) + count
    i = torch.arange(slots, device=dev)
    e = torch.searchsorted(ends, i, right=True).clamp(max=count - 1)
    local = i - (ends[e] - per[e])
    rows = (counts[e] - local * block_m).clamp(0, block_m)
    return torch.stack((e, first_row[e] + local * block_m, torch.where(i < ends[-1], rows, 0)), dim=1)


def moe_scratch(step_rows: int, config: RowsConfig = RowsConfig()) -> bool:
    """Whether the MoE of `step_rows`-row prefill steps decodes its tables into the scratch: by the steps' width
    (config.moe_scratch_tokens), never a call's live rows, so a token's bits keep to its width."""
    return step_rows >= config.moe_scratch_tokens


def _table_rows(rotated: tuple[torch.Tensor, torch.Tensor], table: ExpertTable, tiles: torch.Tensor,
                scratch: bool, config: RowsConfig) -> torch.Tensor:  # fmt: skip
    out = torch.empty((rotated[0].shape[0], table.n), dtype=torch.float32, device=rotated[0].device)
    return launch_rows(rotated, table.words, table.offsets, table.widths, table.codebooks, table.svh, tiles,
                       table.n, table.width_set, table.codebook, out, scratch=scratch, config=config)  # fmt: skip


def moe_rows(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w1: ExpertTable,
             w3: ExpertTable, w2: ExpertTable, swiglu_limit: float = 0.0, scratch: bool | None = None,
             config: RowsConfig = RowsConfig()) -> torch.Tensor:  # fmt: skip
    """fp32 [T, D]: per token, its routed pairs (slot order) then the shared expert, each
    act = silu(min(x W1, L)) * clamp(x W3, -L, L) * weight, summed as act W2 (moe_exl3's maths); the tables
    through the decoded scratch with `scratch`, else decoded in the tiles (default: moe_scratch of the call's
    tokens; the prefill forward passes its step width's)."""
    tokens, topk = topk_ids.shape
    shared = w1.entries - 1
    dev = x.device
    ids = torch.cat(
        (topk_ids.long().clamp(0, shared - 1), torch.full((tokens, 1), shared, device=dev)), dim=1
    )
    wts = torch.cat((topk_weights.float(), torch.ones(tokens, 1, device=dev)), dim=1)
    flat = ids.reshape(-1)
    entries, order = torch.sort(flat, stable=True)
    token = torch.div(order, topk + 1, rounding_mode="floor")
    tiles = expert_tiles(entries, w1.entries, config.block_m)
    scratch = moe_scratch(tokens, config) if scratch is None else scratch
    gate = _table_rows(rotated_rows(x, w1.suh, token, entries), w1, tiles, scratch, config)
    up = _table_rows(rotated_rows(x, w3.suh, token, entries), w3, tiles, scratch, config)
    if swiglu_limit > 0:
        gate, up = gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, swiglu_limit)
    act = F.silu(gate) * up * wts.reshape(-1)[order, None]
    down = _table_rows(rotated_rows(act, w2.suh, entries=entries), w2, tiles, scratch, config)
    per_pair = torch.empty_like(down)
    per_pair[order] = down
    per_pair = per_pair.view(tokens, topk + 1, -1)
    y = per_pair[:, 0]
    for j in range(1, topk + 1):
        y = y + per_pair[:, j]
    return y


__all__ = [
    "RowsConfig",
    "exl3_gemm_rows",
    "expert_tiles",
    "fwht128_rows",
    "moe_rows",
    "moe_scratch",
    "rotate_rows",
    "rotated_rows",
    "scaled_fp16",
]
