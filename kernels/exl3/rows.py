"""EXL3 products for many rows (prefill): tiles of BM rows of one table entry on the matrix units, decoded once.

One program takes BM rows that share an EXL3 entry (a whole linear, or one expert of an expert table) and one
128-column block: it decodes W-hat BK rows at a time in registers (`TILE_DECODE`: the lane decode of
kernels/exl3/lanes.py, or the per-element window gather; `TILE_PREFETCH`: each step's words and rows loaded a
step ahead) and multiplies the rows' rotated input (kernels/exl3/rotate.py: its fp16 high half, the row rounded
to fp16, or with `LOW_HALF` its low half too, so the fp32 rotation reaches the sums to ~2^-22) into fp32; the tile
then applies the output H128 (seven fp32 butterfly stages a row block) and svh before it stores
(`FINISH_IN_TILES`, else a second kernel does). Every row is summed over k in the same
order whatever rows share its tile or launch, so a row's bits never depend on its neighbours or on the row
count. The tile list (entry, first row, rows) is built on the device (`expert_tiles`: no host sync, so a step
using it can be captured); tiles with no rows return at once.

`exl3_gemm_rows` is y = x @ W for a linear; `moe_rows` the clamped-SwiGLU MoE over expert tables with the
pairs grouped by expert (the routed pairs, then each token's shared expert), summed per token in slot order.
By default (`SCRATCH`) the linears' products run through kernels/exl3/scratch.py instead of `_rows_kernel`:
decoded once a call, not once a tile; the rotation, the tiles and the finish are the same on both paths.
The MoE's tables take the scratch too in prefill steps of MOE_SCRATCH_TOKENS rows or more (`moe_scratch`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from tfc.kernels.exl3 import lanes as exl3_lanes
from tfc.kernels.exl3.expert_table import ExpertTable
from tfc.kernels.exl3.lanes import as_block, lane_block, lane_cut, lane_words
from tfc.kernels.exl3.rotate import fwht128_rows, rotate_rows, rotated_pairs, split_halves
from tfc.kernels.exl3.scratch import scratch_rows
from tfc.kernels.exl3.tl import decode_at, finished, fwht128, tile_positions, window_offsets

BLOCK_M = 64  # rows a program takes
# k rows decoded per loop iteration (32 where k is not a multiple of it; prefill_h200.py --paths k32 times 32)
BLOCK_K = 64
NUM_WARPS = 4  # warps a program (launch variants: benchmarks/rows_kernel_h200.py)
NUM_STAGES = 1  # software-pipelining stages of the k loop (launch variants: benchmarks/rows_kernel_h200.py)
# A register cap per thread: at 168 three programs of the tiles fit an SM, where the compiler's own choice (None)
# fits two; the same instructions, so the same bits (timed by benchmarks/prefill_h200.py --paths nocap / cap152 / ...)
MAX_REGS: int | None = 168
# How a tile's loop decodes W-hat: "lanes" (kernels/exl3/lanes.py: a lane's eight weights from the two or three
# words its windows span) or "windows" (two gathered words a weight); the same values, so the same bits (timed against
# each other by benchmarks/prefill_h200.py --paths and rows_kernel_h200.py).
TILE_DECODE = "lanes"
# Whether a tile's loop loads each k step's words and rows one step ahead, in registers (with one pipeline
# stage nothing else overlaps a step's loads with the step before; the same values and order, so the same bits);
# timed against the loop without it by benchmarks/prefill_h200.py --paths noprefetch.
TILE_PREFETCH = True
# Whether the tiles apply the output rotation and svh before they store (`finished`: _finish_kernel's operations
# in its order, so its bits) instead of a second kernel reading and writing every output again; timed against
# the finish kernel by benchmarks/prefill_h200.py --paths nofinish.
FINISH_IN_TILES = True
# Whether the products take the rows' fp16 low halves too (two mma products a k step: the sums see the fp32
# rotation to ~2^-22), or their high halves alone (one product: the rows rounded to fp16, as the decode kernels
# round theirs at 2-16 rows); timed against each other by benchmarks/prefill_h200.py --paths twohalves.
LOW_HALF = False
# Which products decode their weights once a call into a scratch and multiply every tile from it
# (kernels/exl3/scratch.py) instead of decoding them again in every tile's loop: "dense" (the linears; the
# MoE's tables keep the tiles, where an expert with one tile of rows is decoded once anyway), "all" or "none"
# (timed against each other by benchmarks/prefill_h200.py --paths).
SCRATCH = "dense"
# With "dense", the MoE's tables take the scratch too in prefill steps of this many rows or more (enough rows an
# expert that its tiles would decode it several times).
MOE_SCRATCH_TOKENS = 8192


@triton.jit
def _entry_sums(xh_ptr, base, cb, N, K, rows, live, stride_x, lo_off, W: tl.constexpr, CB: tl.constexpr,
                BM: tl.constexpr, BK: tl.constexpr, LANES: tl.constexpr, LO: tl.constexpr,
                PREFETCH: tl.constexpr, CUT: tl.constexpr):  # fmt: skip
    """fp32 [BM, 128]: the rows' rotated input (high part at xh, low part lo_off further, if LO) times W-hat's
    column block at base (width W), summed over k in BK steps; W-hat by the lane decode (LANES) or by window
    gathers; with PREFETCH (lanes only) each step's words and rows are loaded one step ahead, in registers."""
    tn = N // 16
    nw: tl.constexpr = W // 2
    TK: tl.constexpr = BK // 16
    if not LANES:
        off_j, off_jp, shift = window_offsets(tile_positions(BK, 128), W, tn, BK, 128, W % 16 == 0)
    step = TK * tn * nw
    ks = tl.arange(0, BK)
    x_rows = xh_ptr + rows[:, None].to(tl.int64) * stride_x
    acc = tl.zeros([BM, 128], dtype=tl.float32)
    if PREFETCH:
        w0, w1, w2, w3 = lane_words(base, tn, W, TK)
        hi = tl.load(x_rows + ks[None, :], mask=live[:, None], other=0.0)
        lo = hi
        if LO:
            lo = tl.load(x_rows + lo_off + ks[None, :], mask=live[:, None], other=0.0)
        for k0 in range(0, K, BK):
            # the next step's loads (the last step's again after the last: valid addresses, never used)
            k_next = tl.where(k0 + BK < K, k0 + BK, k0)
            n0, n1, n2, n3 = lane_words(base + (k_next - k0) // BK * step, tn, W, TK)
            base += step
            n_hi = tl.load(x_rows + (k_next + ks)[None, :], mask=live[:, None], other=0.0)
            n_lo = n_hi
            if LO:
                n_lo = tl.load(x_rows + lo_off + (k_next + ks)[None, :], mask=live[:, None], other=0.0)
            v = as_block(lane_cut(w0, w1, w2, w3, cb, W, CB, TK, CUT), TK)
            acc = tl.dot(hi, v, acc)
            if LO:
                acc = tl.dot(lo, v, acc)
            w0, w1, w2, w3, hi, lo = n0, n1, n2, n3, n_hi, n_lo
    else:
        for k0 in range(0, K, BK):
            if LANES:
                v = lane_block(base, tn, cb, W, CB, TK, CUT)
            else:
                v = decode_at(base, off_j, off_jp, shift, cb, CB)
            base += step
            hi = tl.load(x_rows + (k0 + ks)[None, :], mask=live[:, None], other=0.0)
            acc = tl.dot(hi, v, acc)
            if LO:
                lo = tl.load(x_rows + lo_off + (k0 + ks)[None, :], mask=live[:, None], other=0.0)
                acc = tl.dot(lo, v, acc)
    return acc


@triton.jit
def _rows_kernel(xh_ptr, inv_ptr, words_ptr, off_ptr, wid_ptr, cb_ptr, y_ptr, tile_ptr, svh_ptr, N, K, stride_x,
                 lo_off, stride_y, WIDTHS: tl.constexpr, CB: tl.constexpr, BM: tl.constexpr, BK: tl.constexpr,
                 LANES: tl.constexpr, LO: tl.constexpr, PREFETCH: tl.constexpr, FINISH: tl.constexpr,
                 PER_ENTRY: tl.constexpr, CUT: tl.constexpr):  # fmt: skip
    """y[rows, block] = (xh[rows] @ W-hat_e[:, block]) * inv[rows] for tile program_id(0)'s rows; the output
    rotation and svh (finished) here with FINISH, else by _finish_kernel."""
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
                              lo_off, WIDTHS[0], CB, BM, BK, LANES, LO, PREFETCH, CUT)  # fmt: skip
        else:  # a ragged table: one branch per width it holds
            width = tl.load(wid_ptr + e)
            for i in tl.static_range(len(WIDTHS)):
                if width == WIDTHS[i]:
                    acc = _entry_sums(xh_ptr, start + pid_n * 8 * (WIDTHS[i] // 2), cb, N, K, rows, live,
                                      stride_x, lo_off, WIDTHS[i], CB, BM, BK, LANES, LO, PREFETCH,
                                      CUT)  # fmt: skip
        acc = acc * tl.load(inv_ptr + rows, mask=live, other=0.0)[:, None]
        cols = pid_n * 128 + tl.arange(0, 128)
        if FINISH:
            acc = finished(acc, svh_ptr, e, N, cols, BM, PER_ENTRY)
        dst = y_ptr + rows[:, None].to(tl.int64) * stride_y + cols[None, :]
        tl.store(dst, acc, mask=live[:, None])


@triton.jit
def _finish_kernel(y_ptr, svh_ptr, ent_ptr, N, stride_y, PER_ROW: tl.constexpr):
    """y[row, block] = had128(y[row, block]) / sqrt(128) * svh_e[block] in place (e: the row's entry, or 0)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * 128 + tl.arange(0, 128)
    e = 0
    if PER_ROW:
        e = tl.load(ent_ptr + row)
    sv = tl.load(svh_ptr + e.to(tl.int64) * N + cols).to(tl.float32)
    dst = y_ptr + row * stride_y + cols
    tl.store(dst, fwht128(tl.load(dst)) * 0.08838834764831845 * sv)


def launch_rows(halves: tuple[torch.Tensor, torch.Tensor], words: torch.Tensor, offsets: torch.Tensor, widths: torch.Tensor,
                codebooks: torch.Tensor, svh: torch.Tensor, tiles: torch.Tensor, n: int, width_set: tuple[int, ...],
                codebook: int, out: torch.Tensor, row_entries: torch.Tensor | None = None,
                scratch: bool = False) -> torch.Tensor:  # fmt: skip
    """out[r] for every row r of every tile (tiles int64 [T, 3]: entry, first row, rows); halves: split_halves;
    svh [n] (one linear), or [entries, n] with row_entries [M] naming each row's entry; `scratch`: through the
    decoded scratch, else decoding in each tile."""
    xh, inv = halves
    m, two, k = xh.shape
    if two != 2 or xh.dtype != torch.float16 or not xh.is_contiguous():
        raise ValueError(f"xh must be contiguous [M, 2, k] fp16 halves, not {tuple(xh.shape)} {xh.dtype}")
    bk = BLOCK_K if k % BLOCK_K == 0 else 32
    if k % bk or n % 128 or tuple(out.shape) != (m, n) or out.stride(1) != 1:
        raise ValueError(f"shapes do not fit: xh {tuple(xh.shape)}, n {n}, out {tuple(out.shape)}")
    if tiles.numel() and m:
        if scratch:
            scratch_rows(xh, inv, words, offsets, widths, codebooks, tiles.contiguous(), n, width_set, codebook,
                         out, BLOCK_M, LOW_HALF, svh if FINISH_IN_TILES else None)  # fmt: skip
        else:
            _rows_kernel[(tiles.shape[0], n // 128)](
                xh, inv, words, offsets, widths, codebooks, out, tiles.contiguous(), svh, n, k, 2 * k, k,
                out.stride(0), WIDTHS=tuple(width_set), CB=codebook, BM=BLOCK_M, BK=bk,
                LANES=TILE_DECODE == "lanes", LO=LOW_HALF, PREFETCH=TILE_PREFETCH and TILE_DECODE == "lanes",
                FINISH=FINISH_IN_TILES, PER_ENTRY=svh.dim() == 2, CUT=exl3_lanes.cut_index(),
                num_warps=NUM_WARPS, num_stages=NUM_STAGES, enable_fp_fusion=not FINISH_IN_TILES,
                **({} if MAX_REGS is None else {"maxnreg": MAX_REGS}),
            )  # fmt: skip
        if not FINISH_IN_TILES:
            per_row = row_entries is not None
            _finish_kernel[(m, n // 128)](out, svh, row_entries if per_row else inv, n, out.stride(0),
                                          PER_ROW=per_row, num_warps=1)  # fmt: skip
    return out


def dense_tiles(rows: int, device: torch.device) -> torch.Tensor:
    """Tiles of entry 0 covering rows [0, rows), BLOCK_M at a time."""
    r0 = torch.arange(0, rows, BLOCK_M, device=device)
    return torch.stack((torch.zeros_like(r0), r0, (rows - r0).clamp(max=BLOCK_M)), dim=1)


def exl3_gemm_rows(x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook: int,
                   out: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """fp32 y [M, n] = x [M, k] @ W for an EXL3 group (trellis int16 [k/16, n/16, W]), any number of rows."""
    tk, tn, width = trellis.shape
    k, n = 16 * tk, 16 * tn
    if x.dim() != 2 or x.shape[1] != k:
        raise ValueError(f"x {tuple(x.shape)} must be [M, {k}]")
    dev = x.device
    y = out if out is not None else torch.empty((x.shape[0], n), dtype=torch.float32, device=dev)
    one = torch.zeros(1, dtype=torch.int64, device=dev)
    return launch_rows(rotated_pairs(x, suh, low=LOW_HALF), trellis.contiguous().view(torch.int32).reshape(-1), one,
                       torch.full((1,), width, dtype=torch.int32, device=dev), one.int() + codebook, svh,
                       dense_tiles(x.shape[0], dev), n, (width,), codebook, y,
                       scratch=SCRATCH in ("dense", "all"))  # fmt: skip


def expert_tiles(entries: torch.Tensor, count: int) -> torch.Tensor:
    """Tiles [ceil(P / BLOCK_M) + count, 3] (entry, first row, rows) over pairs sorted by entry (entries [P],
    ascending, each < count): each entry's rows BLOCK_M at a time, then empty tiles. Device ops only."""
    dev = entries.device
    counts = torch.zeros(count, dtype=torch.int64, device=dev).scatter_add_(
        0, entries, torch.ones_like(entries)
    )
    first_row = torch.cumsum(counts, 0) - counts
    per = torch.div(counts + BLOCK_M - 1, BLOCK_M, rounding_mode="floor")
    ends = torch.cumsum(per, 0)
    slots = -(-entries.numel() // BLOCK_M) + count
    i = torch.arange(slots, device=dev)
    e = torch.searchsorted(ends, i, right=True).clamp(max=count - 1)
    local = i - (ends[e] - per[e])
    rows = (counts[e] - local * BLOCK_M).clamp(0, BLOCK_M)
    return torch.stack((e, first_row[e] + local * BLOCK_M, torch.where(i < ends[-1], rows, 0)), dim=1)


def moe_scratch(step_rows: int) -> bool:
    """Whether the MoE of `step_rows`-row prefill steps decodes its tables into the scratch (SCRATCH,
    MOE_SCRATCH_TOKENS): by the steps' width, never a call's live rows, so a token's bits keep to its width."""
    return SCRATCH == "all" or (SCRATCH == "dense" and step_rows >= MOE_SCRATCH_TOKENS)


def _table_rows(halves: tuple[torch.Tensor, torch.Tensor], table: ExpertTable, tiles: torch.Tensor,
                entries: torch.Tensor, scratch: bool) -> torch.Tensor:  # fmt: skip
    out = torch.empty((halves[0].shape[0], table.n), dtype=torch.float32, device=halves[0].device)
    return launch_rows(halves, table.words, table.offsets, table.widths, table.codebooks, table.svh, tiles, table.n,
                       table.width_set, table.codebook, out, entries, scratch=scratch)  # fmt: skip


def moe_rows(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, w1: ExpertTable,
             w3: ExpertTable, w2: ExpertTable, swiglu_limit: float = 0.0,
             scratch: bool | None = None) -> torch.Tensor:  # fmt: skip
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
    tiles = expert_tiles(entries, w1.entries)
    scratch = moe_scratch(tokens) if scratch is None else scratch
    gate = _table_rows(rotated_pairs(x, w1.suh, token, entries, LOW_HALF), w1, tiles, entries, scratch)
    up = _table_rows(rotated_pairs(x, w3.suh, token, entries, LOW_HALF), w3, tiles, entries, scratch)
    if swiglu_limit > 0:
        gate, up = gate.clamp(max=swiglu_limit), up.clamp(-swiglu_limit, swiglu_limit)
    act = F.silu(gate) * up * wts.reshape(-1)[order, None]
    down = _table_rows(rotated_pairs(act, w2.suh, entries=entries, low=LOW_HALF), w2, tiles, entries, scratch)
    per_pair = torch.empty_like(down)
    per_pair[order] = down
    per_pair = per_pair.view(tokens, topk + 1, -1)
    y = per_pair[:, 0]
    for j in range(1, topk + 1):
        y = y + per_pair[:, j]
    return y


__all__ = [
    "BLOCK_M",
    "exl3_gemm_rows",
    "expert_tiles",
    "fwht128_rows",
    "moe_rows",
    "moe_scratch",
    "rotate_rows",
    "rotated_pairs",
    "split_halves",
]
