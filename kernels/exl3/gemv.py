"""Fused EXL3 GEMV / skinny GEMM (1-16 rows): y = had(had(x*suh) @ W-hat) * svh, trellis decoded on the fly.

Exact reformulation of y = x @ W (spec exl3.md §6): the input rotation xh = had128(x * suh) is either a
separate small launch or, for the one-row run decode, recomputed per k-slice inside the main kernel
(`fuse_rotation`); the main kernel decodes W-hat tiles in registers, accumulates in fp32 (fp32 FMAs on fp32 xh for one row, with the run
decode; from 2 rows on a GPU the mma decode of exl3_mma, fp16 xh, for integer widths; otherwise the matrix
units on fp16 xh or, without a GPU, the run decode for 2-4 rows), splits k over programs and sums the
partials in a fixed order (deterministic): in the last program of each 128-column block to arrive, or in
a second launch (`reduce_apart`), then applies the output Hadamard and svh. The launch choices and their
defaults are exl3_launch.GemmConfig.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3.launch import (
    GemmConfig,
    counters,
    group_offsets,
    input_pairs,
    num_sms,
    pick_split,
    resolved_for,
)
from tfc.kernels.exl3.mma import CHUNKS, mma_asm, mma_partials, mma_warps
from tfc.kernels.exl3.runs import runs_cols, runs_rows, store_cols
from tfc.kernels.exl3.sums import fixed_reduce_kernel, reduce_kernel, reduce_last
from tfc.kernels.exl3.tl import (
    INTERPRET,
    cb_decode,
    load_states,
    next_pow2,
    rotated128,
    store_pair,
    tile_positions,
    window_offsets,
)

MAX_ROWS = 16  # rows of one launch, but for the row-free mma decode's:
WIDE_ROWS = 64  # 4 chunks of 16 rows a program, each decoded tile multiplied into all of them


@triton.jit
def _rotate_kernel(x_ptr, suh_ptr, xh_ptr, K, stride_x, SPLIT: tl.constexpr = False, goff_ptr=None, KG=0,
                   GROUPED: tl.constexpr = False):  # fmt: skip
    """xh[m, blk] = (x[m, blk] * suh[blk]) @ H128 / sqrt(128) for one 128-block of one row (seven butterflies);
    SPLIT: rows 2 m and 2 m + 1 of xh get its fp16 high part and the fp16 rest. GROUPED: grid axis 2 is the
    group, whose KG columns of x and xh start at g * KG and whose suh lies goff[1, g] halves from suh_ptr."""
    blk = tl.program_id(0) * 128
    m = tl.program_id(1)
    if GROUPED:
        g = tl.program_id(2)
        suh_ptr += tl.load(goff_ptr + tl.num_programs(2) + g)
        x_ptr += g * KG
        xh_ptr += g * KG
    xh = rotated128(x_ptr + m * stride_x, suh_ptr, blk)
    cols = blk + tl.arange(0, 128)
    if SPLIT:
        store_pair(xh_ptr + 2 * m * K + cols, K, xh, cols >= 0)
    else:
        tl.store(xh_ptr + m * K + cols, xh.to(xh_ptr.dtype.element_ty))


@triton.jit
def _exl3_gemm_kernel(
    x_ptr,
    xh_ptr,
    suh_ptr,
    svh_ptr,
    t_ptr,
    y_ptr,
    ws_ptr,
    cnt_ptr,
    M,
    N,
    stride_x,
    stride_y,
    kt_per_split,
    W: tl.constexpr,
    CB: tl.constexpr,
    MP: tl.constexpr,
    BK: tl.constexpr,
    SPLIT,
    FUSE_ROT: tl.constexpr,
    USE_DOT: tl.constexpr,
    RUNS: tl.constexpr = False,
    KDIM=0,
    TPE: tl.constexpr = 2,
    MMA: tl.constexpr = 0,
    MMA_SETUP: tl.constexpr = "",
    MMA_FRAG: tl.constexpr = "",
    MMA_LOADS: tl.constexpr = (),
    MMA_STEP: tl.constexpr = "",
    MMA_STORES: tl.constexpr = (),
    MMA_NACC: tl.constexpr = 16,
    MMA_SPLIT: tl.constexpr = False,
    MMA_CHUNKS: tl.constexpr = 1,
    REDUCE: tl.constexpr = True,
    goff_ptr=None,
    XHG=0,
    GROUPED: tl.constexpr = False,
    LIVE=MAX_ROWS,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    tn = N // 16
    if GROUPED:
        # Group g of a grouped launch (grid axis 2): its trellis, suh and svh lie goff[:, g] elements from
        # group 0's; its x and y columns, rotated input, partials and counters follow group 0's.
        g = tl.program_id(2)
        ng = tl.num_programs(2)
        t_ptr += tl.load(goff_ptr + g)
        suh_ptr += tl.load(goff_ptr + ng + g)
        svh_ptr += tl.load(goff_ptr + 2 * ng + g)
        x_ptr += g * KDIM
        xh_ptr += g * XHG
        y_ptr += g * N
        ws_ptr += g * tl.num_programs(0) * SPLIT * (MP * 128)
        cnt_ptr += g * tl.num_programs(0)
    nw: tl.constexpr = W // 2
    cols = pid_n * 128 + tl.arange(0, 128)
    block = ws_ptr + pid_n * SPLIT * (MP * 128)
    kt0 = pid_s * kt_per_split
    m = tl.arange(0, MP)
    if RUNS and MP > 1:
        # Several rows, integer width: the one-row run decode, each decoded weight times all MP rows.
        base = t_ptr + (kt0 * tn + pid_n * 8).to(tl.int64) * nw
        runs_rows(base, tn, kt_per_split, xh_ptr + kt0 * 16, stride_x, M, block + pid_s * (MP * 128), W, CB,
                  BK // 16, TPE, MP)  # fmt: skip
    elif RUNS:
        # One row, integer width: 32-position runs cut from words loaded once (exl3_runs).
        xs = xh_ptr
        if FUSE_ROT:
            # This program's rows of had128(x * suh), into its column block's row of the xh scratch.
            xs = xh_ptr + pid_n * KDIM
            i = tl.arange(0, 128)
            for r0 in range(kt0 * 16, (kt0 + kt_per_split) * 16, BK):
                blk = (r0 // 128) * 128
                keep = (i >= r0 - blk) & (i < r0 - blk + BK)
                tl.store(xs + blk + i, rotated128(x_ptr, suh_ptr, blk), mask=keep)
            tl.debug_barrier()
        base = t_ptr + (kt0 * tn + pid_n * 8).to(tl.int64) * nw
        a, b = runs_cols(base, tn, kt_per_split, xs + kt0 * 16, W, CB, BK // 16, TPE)
        store_cols(block + pid_s * 128, a, b)
    elif MMA:
        # Integer width, 1-64 rows: each lane decodes its own B fragments straight into mma (exl3_mma).
        base = t_ptr + (kt0 * tn + pid_n * 8).to(tl.int64) * nw
        x_rows = M
        if MMA_SPLIT:  # xh holds each row as an fp16 high / low pair
            x_rows = 2 * M
        mma_partials(base, tn, kt_per_split, xh_ptr + kt0 * 16, stride_x, x_rows, block + pid_s * (MP * 128), W,
                     MMA, MMA_SETUP, MMA_FRAG, MMA_LOADS, MMA_STEP, MMA_STORES, MMA_NACC, 0, MMA_CHUNKS)  # fmt: skip
    else:
        pos = tile_positions(BK, 128)
        off_j, off_jp, shift = window_offsets(pos, W, tn, BK, 128, W % 16 == 0)
        base = t_ptr + (kt0 * tn + pid_n * 8).to(tl.int64) * nw
        step = (BK // 16) * tn * nw
        if USE_DOT:
            acc = tl.zeros([MP, 128], dtype=tl.float32)
        else:
            acc2 = tl.zeros([BK, 128], dtype=tl.float32)
        for kk in range(0, kt_per_split, BK // 16):
            v = cb_decode(load_states(base, off_j, off_jp, shift), CB)
            base += step
            row0 = (kt0 + kk) * 16
            if USE_DOT:
                rows = row0 + tl.arange(0, BK)
                xa = tl.load(xh_ptr + m[:, None] * stride_x + rows[None, :], mask=m[:, None] < M)
                acc = tl.dot(xa, v, acc)
            else:
                xa = tl.load(xh_ptr + row0 + tl.arange(0, BK)).to(tl.float32)
                acc2 += xa[:, None] * v.to(tl.float32)
        # Every program parks its partial in the workspace; the last one of the column block (arrival
        # counter) sums them in split order, so results do not depend on scheduling.
        if not USE_DOT:
            acc = tl.sum(acc2, axis=0)[None, :]
        tl.store(block + pid_s * (MP * 128) + m[:, None] * 128 + tl.arange(0, 128)[None, :], acc)
    if REDUCE:  # else reduce_kernel, launched next, sums the partials
        reduce_last(cnt_ptr, svh_ptr, y_ptr, block, pid_n, cols, M, stride_y, SPLIT, MP,
                    (RUNS and MP > 1) or MMA, LIVE)  # fmt: skip


def launch_rows(config: GemmConfig, trellis_shape: tuple[int, ...]) -> int:
    """The most rows one exl3_gemm launch takes for this config and trellis: WIDE_ROWS on the row-free mma decode
    (a GPU, an integer width), else MAX_ROWS."""
    cfg = resolved_for(config, MAX_ROWS, trellis_shape)
    return WIDE_ROWS if cfg.row_free and cfg.mma else MAX_ROWS


def wide_chunks(rows: int) -> int:
    """16-row chunks a program of the row-free mma decode takes for `rows` rows: 1, 2 or 4 (exl3_mma.CHUNKS)."""
    return next(c for c in CHUNKS if 16 * c >= rows)


def uses_matrix_units(config: GemmConfig, rows: int, trellis_shape: tuple[int, ...]) -> bool:
    """Whether exl3_gemm rounds the rotated input to fp16 for `config` at these rows and this trellis shape
    (the matrix units, except the weights-as-A mma decode's high / low input pairs)."""
    cfg = resolved_for(config, rows, trellis_shape)
    return bool(cfg.use_dot) and not input_pairs(cfg, rows)


def rotate_input(x: torch.Tensor, suh: torch.Tensor, use_dot: bool, split: bool = False,
                 groups: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """xh = had128(x * suh): fp16 for the matrix-unit path, fp32 for the FMA paths (one row or the run decode);
    split: [M, 2, k] fp16, each row as its high part then the rest (the weights-as-A mma decode, <= 4 rows);
    groups (group_offsets): x [M, G * k] as G groups of k columns, each rotated by its own suh."""
    m_rows, k = x.shape
    dtype = torch.float16 if use_dot or split else torch.float32
    xh = torch.empty((m_rows, 2, k) if split else (m_rows, k), dtype=dtype, device=x.device)
    kg, ng = suh.shape[0], 1 if groups is None else groups.shape[1]
    _rotate_kernel[(kg // 128, m_rows, ng)](x, suh, xh, k, x.stride(0), SPLIT=split, num_warps=1,
                                            goff_ptr=suh if groups is None else groups, KG=kg,
                                            GROUPED=groups is not None)  # fmt: skip
    return xh


def rotate_for(
    x: torch.Tensor, suh: torch.Tensor, config: GemmConfig, trellis_shape: tuple[int, ...]
) -> torch.Tensor:
    """The rotated input exl3_gemm(..., x_rotated=True) takes for `config` at x's rows and this trellis shape."""
    rows = x.shape[0]
    cfg = resolved_for(config, rows, trellis_shape)
    return rotate_input(x, suh, bool(cfg.use_dot), input_pairs(cfg, rows))


def exl3_gemm(
    x: torch.Tensor,
    trellis: torch.Tensor,
    suh: torch.Tensor,
    svh: torch.Tensor,
    codebook: int,
    out_dtype: torch.dtype | None = None,
    config: GemmConfig = GemmConfig(),
    out: torch.Tensor | None = None,
    x_rotated: bool = False,
    fixed: bool = False,
    groups: torch.Tensor | None = None,
    live: int | None = None,
) -> torch.Tensor:
    """y [M, n] = x [M, k] @ W for an EXL3 group (trellis int16 [k/16, n/16, W]); M <= launch_rows(config, ...)
    rows: 16, or WIDE_ROWS on the row-free mma decode, whose programs multiply each decoded tile into up to 4
    chunks of 16 rows (one group of n-tiles a warp), each row with the bits it has in a launch of 1-16 rows.

    `groups` (group_offsets of G groups of this trellis's shape, these views group 0's): one launch of G
    products, y [M, G * n] = each group's k columns of x [M, G * k] @ its W, each group computed exactly as its
    own exl3_gemm with the same config would (same decode, k-split and order, so the same bits).

    `live`: only x's first `live` rows are wanted; y's later rows come back as zeros, their partials never
    summed. The product runs every row, so a wanted row's bits are those of the whole launch; a `row_free`
    config's runs the live rows alone (x's later rows are never read), each with the bits it has among 16.

    `x_rotated=True`: x is already rotate_for(x, suh, config, trellis.shape) (lets a caller fuse that step
    elsewhere). `fixed=True`: y as a fixed-point sum int64 [2, M, n] (kernels/exl3/fixed.py) of one partial per
    128-row block of k (the k-split forced to k / 128, whatever config says), which a row-parallel rank adds to
    the other ranks' by an integer all-reduce before exl3_fixed.fixed_value.
    """
    tk, tn, width = trellis.shape
    k, n = 16 * tk, 16 * tn
    ng = 1 if groups is None else groups.shape[1]
    if groups is not None and (x_rotated or fixed or groups.shape[0] != 3):
        raise ValueError("grouped products take x unrotated, give fp values, and need group_offsets' [3, G]")
    pairs_in = x_rotated and x.dim() == 3 and x.shape[1] == 2  # rotate_for's high / low pairs
    most = launch_rows(config, trellis.shape)
    if x.dim() != 2 + pairs_in or x.shape[-1] != ng * k or not 1 <= x.shape[0] <= most:
        raise ValueError(f"x {tuple(x.shape)} must be [1..{most}, {ng * k}]")
    m_rows = x.shape[0]
    live = m_rows if live is None else live
    if not 1 <= live <= m_rows or (fixed and live != m_rows):
        raise ValueError(f"live {live} must be 1..{m_rows} rows (all of them for fixed-point sums)")
    prod = live if config.row_free else m_rows  # the rows the product runs
    cfg = resolved_for(config, prod, trellis.shape)
    pairs = input_pairs(cfg, prod)
    if x_rotated and pairs != pairs_in:
        raise ValueError("x_rotated: x must be rotate_for(x, suh, config, trellis.shape) of this config")
    chunks = wide_chunks(prod) if cfg.mma and m_rows > MAX_ROWS else 1
    # chunks keep their sums in one group's registers (a group's n-tiles per warp never change a sum's bits)
    warp_groups = cfg.mma if chunks == 1 else 1
    mp = 16 * chunks if cfg.use_dot else next_pow2(m_rows)
    if mp > 1 and not (cfg.use_dot or cfg.runs):
        raise ValueError(f"{m_rows} rows need the matrix units (use_dot) or the run decode (integer width)")
    if cfg.mma and (width % 16 or INTERPRET):
        raise ValueError("the mma decode needs an integer width and a GPU (inline PTX)")
    fuse = cfg.fuse_rotation and not x_rotated
    if fuse and not (cfg.runs and mp == 1):
        raise ValueError("only the one-row run decode fuses the input rotation")
    if x.stride(-1) != 1 or (pairs_in and not x.is_contiguous()):
        x = x.contiguous()
    bk = cfg.block_k
    blocks = n // 128
    split = cfg.split or pick_split(tk, bk // 16, blocks, num_sms(x.device), cfg.waves)
    if cfg.row_free and not cfg.split and cfg.row_free_max_split:
        split = min(split, pick_split(tk, bk // 16, 1, cfg.row_free_max_split, 1.0))
    if fixed:
        if tk % 8:
            raise ValueError(f"fixed: k = {k} is not whole 128-row blocks")
        split = tk // 8
    if tk % (split * (bk // 16)):
        raise ValueError(f"split {split} x block_k {bk} does not divide k = {k}")
    want = (2, m_rows, n) if fixed else (m_rows, ng * n)
    y = out if out is not None else torch.empty(want, dtype=torch.int64 if fixed else out_dtype or x.dtype,
                                                 device=x.device)  # fmt: skip
    if tuple(y.shape) != want or y.stride(-1) != 1 or (fixed and not y.is_contiguous()):
        raise ValueError(f"out {tuple(y.shape)} must be {list(want)} with unit column stride")
    xh = x if (fuse or x_rotated) else rotate_input(x[:prod], suh, cfg.use_dot, pairs, groups)
    xhg = k  # where group g's rotated input starts: g * xhg elements on
    if fuse:  # each program rotates its own rows into a per-column-block scratch
        xh = torch.empty((ng * blocks, k), dtype=torch.float32, device=x.device)
        xhg = blocks * k
    ws = torch.empty((ng * blocks * split * mp * 128,), dtype=torch.float32, device=x.device)
    apart = cfg.reduce_apart or fixed
    cnt = counters(x.device, ng * blocks) if split > 1 and not apart else y
    grouped = {"goff_ptr": groups, "GROUPED": True} if groups is not None else {}
    _exl3_gemm_kernel[(blocks, split, ng)](
        x, xh, suh, svh, trellis.view(torch.int32), y, ws, cnt,
        prod, n, x.stride(0) if fuse else xh.stride(-2), y.stride(-2), tk // split,
        W=width, CB=codebook, MP=mp, BK=bk, SPLIT=split, FUSE_ROT=fuse, USE_DOT=cfg.use_dot,
        RUNS=cfg.runs, KDIM=k, TPE=cfg.run_tiles, num_warps=mma_warps(warp_groups) if cfg.mma else cfg.num_warps,
        num_stages=1, MMA=warp_groups, REDUCE=not apart, XHG=xhg, LIVE=live, **grouped,
        **(mma_asm(width, codebook, prod, warp_groups, cfg.mma_wt, not cfg.row_free, chunks) if cfg.mma else {}),
    )  # fmt: skip
    if fixed:
        fixed_reduce_kernel[(blocks, m_rows)](ws, svh, y, m_rows, n, split, MP=mp, num_warps=1)
    elif apart:
        reduce_kernel[(blocks, m_rows, ng)](
            ws, svh, y, y.stride(0), split, live, MP=mp, FLIGHT=cfg.reduce_flight,
            num_warps=max(1, cfg.reduce_flight // 8),
            N=n, **grouped,
        )  # fmt: skip
    return y


def exl3_gemm_reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Torch reference: x @ W in float64 (W = the dense reference weight [k, n])."""
    return x.double() @ w.double()


__all__ = [
    "INTERPRET",
    "MAX_ROWS",
    "WIDE_ROWS",
    "GemmConfig",
    "counters",
    "exl3_gemm",
    "exl3_gemm_reference",
    "group_offsets",
    "launch_rows",
    "resolved_for",
    "rotate_for",
    "rotate_input",
    "uses_matrix_units",
    "wide_chunks",
]
