"""Triton pieces of the MoE kernels (moe_exl3): a pair's token and expert, k-ranges, one expert's 128 columns by
the run decode, the gather decode or the weights-as-A mma decode (a group's rows at once), and the gate/up
epilogue (SwiGLU, the down projection's input rotation)."""

from __future__ import annotations

import triton
import triton.language as tl
from tfc.kernels.exl3.mma import mma_partials
from tfc.kernels.exl3.runs import runs_cols, store_cols
from tfc.kernels.exl3.tl import (
    decode_at,
    prefetch_rows,
    rotate_sum,
    store_pair,
    tile_positions,
    window_offsets,
)


@triton.jit
def pair(ids_ptr, wts_ptr, p, topk, n_routed):
    """(token, table entry, routing weight) of pair p = t * (topk + 1) + j; j = topk is the shared expert."""
    t = p // (topk + 1)
    j = p % (topk + 1)
    shared = j == topk
    q = t * topk + tl.minimum(j, topk - 1)
    e = tl.load(ids_ptr + q).to(tl.int32)
    e = tl.where(shared, n_routed, tl.minimum(tl.maximum(e, 0), n_routed - 1))
    w = tl.where(shared, 1.0, tl.load(wts_ptr + q).to(tl.float32))
    return t, e, w


@triton.jit
def k_range(q, KT, SPLIT):
    """First k-tile and k-tile count of k-split q of SPLIT over KT k-tiles (counts differ by at most one)."""
    kt0 = q * KT // SPLIT
    return kt0, (q + 1) * KT // SPLIT - kt0


@triton.jit
def entry_base(words_ptr, off_ptr, e, kt0, tn, pid_c, nw):
    """Entry e's first int32 word of k-tile row kt0, column block pid_c (tn tiles per row, nw words a tile)."""
    return words_ptr + tl.load(off_ptr + e) // 4 + (kt0 * tn + pid_c * 8).to(tl.int64) * nw


@triton.jit
def mma_cols(t_ptr, off_ptr, wid_ptr, e, kt0, kt_per, tn, pid_c, x_ptr, stride_x, dst, M, G: tl.constexpr,
             WIDTHS: tl.constexpr, SETUP: tl.constexpr, FRAG: tl.constexpr, LOADS: tl.constexpr,
             STEP: tl.constexpr, STORES: tl.constexpr):  # fmt: skip
    """exl3_mma.mma_partials over entry e's k-tiles [kt0, kt0 + kt_per) of column block pid_c, M / 2 rows as fp16
    high / low pairs at x_ptr (row m at m stride_x), their sums rows 128 floats apart at dst; the table's widths
    are WIDTHS and the PTX of WIDTHS[i] sits at index i of the others: one branch per width where entries differ
    (a ragged table), none where they do not."""
    if len(WIDTHS) == 1:
        _mma_width(t_ptr, off_ptr, e, kt0, kt_per, tn, pid_c, x_ptr, stride_x, dst, M, G, 0, WIDTHS, SETUP, FRAG,
                   LOADS, STEP, STORES)  # fmt: skip
    else:
        width = tl.load(wid_ptr + e)
        for i in tl.static_range(len(WIDTHS)):
            if width == WIDTHS[i]:
                _mma_width(t_ptr, off_ptr, e, kt0, kt_per, tn, pid_c, x_ptr, stride_x, dst, M, G, i, WIDTHS,
                           SETUP, FRAG, LOADS, STEP, STORES)  # fmt: skip


@triton.jit
def _mma_width(t_ptr, off_ptr, e, kt0, kt_per, tn, pid_c, x_ptr, stride_x, dst, M, G: tl.constexpr,
               IDX: tl.constexpr, WIDTHS: tl.constexpr, SETUP: tl.constexpr, FRAG: tl.constexpr,
               LOADS: tl.constexpr, STEP: tl.constexpr, STORES: tl.constexpr):  # fmt: skip
    """mma_cols for the table's width WIDTHS[IDX]: its PTX the IDX-th of SETUP, FRAG, STEP and the IDX-th G
    of LOADS, STORES."""
    W: tl.constexpr = WIDTHS[IDX]
    SETUP_I: tl.constexpr = SETUP[IDX]
    FRAG_I: tl.constexpr = FRAG[IDX]
    STEP_I: tl.constexpr = STEP[IDX]
    base = entry_base(t_ptr, off_ptr, e, kt0, tn, pid_c, W // 2)
    mma_partials(base, tn, kt_per, x_ptr, stride_x, M, dst, W, G, SETUP_I, FRAG_I, LOADS, STEP_I, STORES, 8,
                 IDX)  # fmt: skip


@triton.jit
def expert_cols(words_ptr, off_ptr, wid_ptr, cb_ptr, e, pid_c, kt0, kt_per, tn, xin_ptr, dst, W: tl.constexpr,
                CB: tl.constexpr, BK: tl.constexpr, PF: tl.constexpr, RUNS: tl.constexpr, TPE: tl.constexpr,
                RW: tl.constexpr = ()):  # fmt: skip
    """dst[c] = sum over rows [16 kt0, 16 (kt0 + kt_per)) of xh[row] * W-hat_e[row, 128 pid_c + c], c < 128;
    RW: the table's widths (the run decode takes a branch per width on a ragged table, W = 0)."""
    if W > 0:
        width = W
    else:
        width = tl.load(wid_ptr + e)
    nw = width // 2
    base = entry_base(words_ptr, off_ptr, e, kt0, tn, pid_c, nw)
    if RUNS:
        # Integer widths, one codebook: 32-position runs cut from words loaded once (exl3_runs).
        if W > 0:
            a, b = runs_cols(base, tn, kt_per, xin_ptr + kt0 * 16, W, CB, BK // 16, TPE)
            store_cols(dst, a, b)
        else:  # only the widths the table holds: fewer branches to compile than every integer width
            for i in tl.static_range(len(RW)):
                if width == RW[i]:
                    a, b = runs_cols(base, tn, kt_per, xin_ptr + kt0 * 16, RW[i], CB, BK // 16, TPE)
                    store_cols(dst, a, b)
    else:
        _expert_cols_gather(base, cb_ptr, e, kt0, kt_per, tn, xin_ptr, dst, width, nw, W, CB, BK, PF)


@triton.jit
def _expert_cols_gather(base, cb_ptr, e, kt0, kt_per, tn, xin_ptr, dst, width, nw, W: tl.constexpr,
                        CB: tl.constexpr, BK: tl.constexpr, PF: tl.constexpr):  # fmt: skip
    """expert_cols by per-element window gathers (any width, codebooks chosen per entry)."""
    pos = tile_positions(BK, 128)
    off_j, off_jp, shift = window_offsets(pos, width, tn, BK, 128, W > 0 and W % 16 == 0)
    acc2 = tl.zeros([BK, 128], dtype=tl.float32)
    step = (BK // 16) * tn * nw
    cb = 0
    if CB < 0:
        cb = tl.load(cb_ptr + e)
    for kk in range(0, kt_per, BK // 16):
        if PF > 0:  # noqa: SIM102 (compile-time switch around a run-time test)
            if kk + PF * (BK // 16) < kt_per:
                prefetch_rows(base + PF * step, BK // 16, tn * nw, 16 * width)
        v = decode_at(base, off_j, off_jp, shift, cb, CB)
        base += step
        row0 = (kt0 + kk) * 16
        xa = tl.load(xin_ptr + row0 + tl.arange(0, BK))
        acc2 += xa[:, None] * v.to(tl.float32)
    tl.store(dst + tl.arange(0, 128), tl.sum(acc2, axis=0))


@triton.jit
def gate_up_epilogue(gate_ptr, up_ptr, part_stride, nsum, scratch, e, w, row, pid_c, NI, limit, svh1_ptr, svh3_ptr,
                     suh2_ptr, act_ptr, PAIRS: tl.constexpr = False, FLIGHT: tl.constexpr = 8):  # fmt: skip
    """Sum one row's split partials (part_stride apart, FLIGHT loaded at a time), SwiGLU one 128-column block,
    then rotate it for the down projection through `scratch` (PAIRS: into act[row, 0 | 1] as the fp16 high / low
    pair the mma decode reads, else fp32 act[row])."""
    cols = pid_c * 128 + tl.arange(0, 128)
    g = (
        rotate_sum(gate_ptr, nsum, part_stride, 0, 1, FLIGHT)
        * tl.load(svh1_ptr + e * NI + cols).to(tl.float32)[None, :]
    )
    u = (
        rotate_sum(up_ptr, nsum, part_stride, 0, 1, FLIGHT)
        * tl.load(svh3_ptr + e * NI + cols).to(tl.float32)[None, :]
    )
    g = tl.minimum(g, limit)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    act = g * tl.sigmoid(g) * u * w
    a2 = act * tl.load(suh2_ptr + e * NI + cols).to(tl.float32)[None, :]
    tl.store(scratch + tl.arange(0, 128)[None, :], a2)
    tl.debug_barrier()
    rotated = rotate_sum(scratch, 1, 0, 0, 1)
    if PAIRS:
        store_pair(act_ptr + 2 * row * NI + cols, NI, tl.reshape(rotated, (128,)), cols >= 0)
    else:
        tl.store(act_ptr + row * NI + cols[None, :], rotated)


__all__ = ["entry_base", "expert_cols", "gate_up_epilogue", "k_range", "mma_cols", "pair"]
