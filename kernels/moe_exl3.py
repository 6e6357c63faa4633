"""EXL3 MoE over expert tables: clamped SwiGLU experts (w1 gate, w3 up, w2 down) + the shared expert.

For each token t and slot j (top-k routed experts, then the shared expert = the table's last entry with
weight 1) the pair computes act = silu(min(x W1, L)) * clamp(x W3, -L, L) * weight (fp32, the routing weight
multiplies the activation before the down projection, as the reference does) and y[t] += act W2.
Launches: an optional input rotation (all pairs, both w1 and w3), one fused gate+up launch whose epilogue
applies SwiGLU and the down projection's input rotation, and one down launch whose last program per
(token, 128 columns) sums the pairs in a fixed order. No Python loop over experts. The decode is the
32-position run decode (exl3_runs), the per-element gather, or (MoeConfig.mma, the GPU default on tables of
integer widths) the weights-as-A mma decode of exl3_mma with each pair's row as an fp16 high / low pair.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3_gemv import counters, even_split, num_sms, pick_split
from tfc.kernels.exl3_mma import mma_asm, mma_partials, mma_warps
from tfc.kernels.exl3_runs import runs_cols, store_cols
from tfc.kernels.exl3_tl import (
    INTERPRET,
    cb_decode,
    cb_decode_rt,
    load_states,
    prefetch_rows,
    release_fence,
    rotate_sum,
    rotated_slice,
    store_pair,
    sum_parts,
    tile_positions,
    window_offsets,
)
from tfc.kernels.expert_table import ExpertTable


@triton.jit
def _pair(ids_ptr, wts_ptr, p, topk, n_routed):
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
def _k_range(q, KT, SPLIT):
    """First k-tile and k-tile count of k-split q of SPLIT over KT k-tiles (counts differ by at most one)."""
    kt0 = q * KT // SPLIT
    return kt0, (q + 1) * KT // SPLIT - kt0


@triton.jit
def _entry_base(words_ptr, off_ptr, e, kt0, tn, pid_c, nw):
    """Entry e's first int32 word of k-tile row kt0, column block pid_c (tn tiles per row, nw words a tile)."""
    return words_ptr + tl.load(off_ptr + e) // 4 + (kt0 * tn + pid_c * 8).to(tl.int64) * nw


@triton.jit
def _mma_cols(t_ptr, off_ptr, wid_ptr, e, kt0, kt_per, tn, pid_c, x_ptr, stride_x, dst, G: tl.constexpr,
              WIDTHS: tl.constexpr, SETUP: tl.constexpr, FRAG: tl.constexpr, LOADS: tl.constexpr,
              STEP: tl.constexpr, STORES: tl.constexpr):  # fmt: skip
    """exl3_mma.mma_partials over entry e's k-tiles [kt0, kt0 + kt_per) of column block pid_c, one row as an fp16
    high / low pair at x_ptr; the table's widths are WIDTHS and the PTX of WIDTHS[i] sits at index i of the
    others: one branch per width where entries differ (a ragged table), none where they do not."""
    if len(WIDTHS) == 1:
        _mma_width(t_ptr, off_ptr, e, kt0, kt_per, tn, pid_c, x_ptr, stride_x, dst, G, 0, WIDTHS, SETUP, FRAG,
                   LOADS, STEP, STORES)  # fmt: skip
    else:
        width = tl.load(wid_ptr + e)
        for i in tl.static_range(len(WIDTHS)):
            if width == WIDTHS[i]:
                _mma_width(t_ptr, off_ptr, e, kt0, kt_per, tn, pid_c, x_ptr, stride_x, dst, G, i, WIDTHS, SETUP,
                           FRAG, LOADS, STEP, STORES)  # fmt: skip


@triton.jit
def _mma_width(t_ptr, off_ptr, e, kt0, kt_per, tn, pid_c, x_ptr, stride_x, dst, G: tl.constexpr,
               IDX: tl.constexpr, WIDTHS: tl.constexpr, SETUP: tl.constexpr, FRAG: tl.constexpr,
               LOADS: tl.constexpr, STEP: tl.constexpr, STORES: tl.constexpr):  # fmt: skip
    """_mma_cols for the table's width WIDTHS[IDX]: its PTX the IDX-th of SETUP, FRAG, STEP and the IDX-th G
    of LOADS, STORES."""
    W: tl.constexpr = WIDTHS[IDX]
    SETUP_I: tl.constexpr = SETUP[IDX]
    FRAG_I: tl.constexpr = FRAG[IDX]
    STEP_I: tl.constexpr = STEP[IDX]
    base = _entry_base(t_ptr, off_ptr, e, kt0, tn, pid_c, W // 2)
    mma_partials(base, tn, kt_per, x_ptr, stride_x, 2, dst, W, G, SETUP_I, FRAG_I, LOADS, STEP_I, STORES, 8,
                 IDX)  # fmt: skip


@triton.jit
def _expert_cols(words_ptr, off_ptr, wid_ptr, cb_ptr, e, pid_c, kt0, kt_per, tn, xin_ptr, suh_ptr, dst,
                 FUSE: tl.constexpr, W: tl.constexpr, CB: tl.constexpr, BK: tl.constexpr, PF: tl.constexpr,
                 RUNS: tl.constexpr, TPE: tl.constexpr, RW: tl.constexpr = ()):  # fmt: skip
    """dst[c] = sum over rows [16 kt0, 16 (kt0 + kt_per)) of xh[row] * W-hat_e[row, 128 pid_c + c], c < 128;
    RW: the table's widths (the run decode takes a branch per width on a ragged table, W = 0)."""
    if W > 0:
        width = W
    else:
        width = tl.load(wid_ptr + e)
    nw = width // 2
    base = _entry_base(words_ptr, off_ptr, e, kt0, tn, pid_c, nw)
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
        _expert_cols_gather(base, cb_ptr, e, kt0, kt_per, tn, xin_ptr, suh_ptr, dst, width, nw,
                            FUSE, W, CB, BK, PF)  # fmt: skip


@triton.jit
def _expert_cols_gather(base, cb_ptr, e, kt0, kt_per, tn, xin_ptr, suh_ptr, dst, width, nw,
                        FUSE: tl.constexpr, W: tl.constexpr, CB: tl.constexpr, BK: tl.constexpr,
                        PF: tl.constexpr):  # fmt: skip
    """_expert_cols by per-element window gathers (any width, codebooks chosen per entry)."""
    pos = tile_positions(BK, 128)
    off_j, off_jp, shift = window_offsets(pos, width, tn, BK, 128, W > 0 and W % 16 == 0)
    acc2 = tl.zeros([BK, 128], dtype=tl.float32)
    step = (BK // 16) * tn * nw
    if CB < 0:
        cb = tl.load(cb_ptr + e)
    for kk in range(0, kt_per, BK // 16):
        if PF > 0:  # noqa: SIM102 (compile-time switch around a run-time test)
            if kk + PF * (BK // 16) < kt_per:
                prefetch_rows(base + PF * step, BK // 16, tn * nw, 16 * width)
        s = load_states(base, off_j, off_jp, shift)
        if CB >= 0:
            v = cb_decode(s, CB)
        else:
            v = cb_decode_rt(s, cb)
        base += step
        row0 = (kt0 + kk) * 16
        if FUSE:
            xa = tl.sum(rotated_slice(xin_ptr, suh_ptr, 1, 0, row0, 1, BK), axis=0)
        else:
            xa = tl.load(xin_ptr + row0 + tl.arange(0, BK))
        acc2 += xa[:, None] * v.to(tl.float32)
    tl.store(dst + tl.arange(0, 128), tl.sum(acc2, axis=0))


@triton.jit
def _moe_rotate_kernel(x_ptr, ids_ptr, suh1_ptr, suh3_ptr, xh_ptr, ws_ptr, P, D, stride_x, topk, n_routed,
                       PAIRS: tl.constexpr = False):  # fmt: skip
    """xh[proj, p, blk] = had128(x[t, blk] * suh_proj[e, blk]) for w1 (proj 0) and w3 (proj 1); PAIRS: as the
    fp16 high / low row pair xh[proj, p, 0 | 1, blk] the mma decode reads."""
    blk = tl.program_id(0)
    p = tl.program_id(1)
    proj = tl.program_id(2)
    t, e, _ = _pair(ids_ptr, ids_ptr, p, topk, n_routed)
    cols = blk * 128 + tl.arange(0, 128)
    if proj == 0:
        su = tl.load(suh1_ptr + e * D + cols)
    else:
        su = tl.load(suh3_ptr + e * D + cols)
    a = tl.load(x_ptr + t * stride_x + cols).to(tl.float32) * su.to(tl.float32)
    row = (proj * P + p) * D + blk * 128
    tl.store(ws_ptr + row + tl.arange(0, 128), a)
    tl.debug_barrier()
    xh = rotate_sum(ws_ptr + row, 1, 0, 0, 1)
    if PAIRS:
        i = tl.arange(0, 128)
        store_pair(xh_ptr + 2 * (proj * P + p) * D + blk * 128 + i, D, tl.reshape(xh, (128,)), i >= 0)
    else:
        tl.store(xh_ptr + row + tl.arange(0, 128)[None, :], xh)


@triton.jit
def _gate_up_epilogue(slot_ws, nsum, e, w, p, pid_c, NI, limit, svh1_ptr, svh3_ptr, suh2_ptr, act_ptr,
                      PAIRS: tl.constexpr = False, FLIGHT: tl.constexpr = 8):  # fmt: skip
    """Sum the split partials (FLIGHT loaded at a time), SwiGLU one 128-column block, then rotate it for the
    down projection (PAIRS: into act[p, 0 | 1] as the fp16 high / low pair the mma decode reads, else fp32
    act[p])."""
    cols = pid_c * 128 + tl.arange(0, 128)
    g = (
        rotate_sum(slot_ws, nsum, 256, 0, 1, FLIGHT)
        * tl.load(svh1_ptr + e * NI + cols).to(tl.float32)[None, :]
    )
    u = (
        rotate_sum(slot_ws + 128, nsum, 256, 0, 1, FLIGHT)
        * tl.load(svh3_ptr + e * NI + cols).to(tl.float32)[None, :]
    )
    g = tl.minimum(g, limit)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    act = g * tl.sigmoid(g) * u * w
    a2 = act * tl.load(suh2_ptr + e * NI + cols).to(tl.float32)[None, :]
    scratch = slot_ws + nsum * 256
    tl.store(scratch + tl.arange(0, 128)[None, :], a2)
    tl.debug_barrier()
    rotated = rotate_sum(scratch, 1, 0, 0, 1)
    if PAIRS:
        store_pair(act_ptr + 2 * p * NI + cols, NI, tl.reshape(rotated, (128,)), cols >= 0)
    else:
        tl.store(act_ptr + p * NI + cols[None, :], rotated)


@triton.jit
def _moe_gate_up_kernel(
    x_ptr, ids_ptr, wts_ptr, xh_ptr,
    t1_ptr, off1_ptr, wid1_ptr, cb1_ptr, suh1_ptr, svh1_ptr,
    t3_ptr, off3_ptr, wid3_ptr, cb3_ptr, suh3_ptr, svh3_ptr,
    suh2_ptr, act_ptr, ws_ptr, cnt_ptr,
    P, D, NI, stride_x, topk, n_routed, KT, limit,
    W1: tl.constexpr, CB1: tl.constexpr, W3: tl.constexpr, CB3: tl.constexpr,
    BK: tl.constexpr, FUSE: tl.constexpr, PF: tl.constexpr, SPLIT, RUNS: tl.constexpr,
    TPE: tl.constexpr, MMA: tl.constexpr = 0, FLIGHT: tl.constexpr = 8, RW1: tl.constexpr = (),
    RW3: tl.constexpr = (),
    MMA_WIDTHS1: tl.constexpr = (), MMA_SETUP1: tl.constexpr = (), MMA_FRAG1: tl.constexpr = (),
    MMA_LOADS1: tl.constexpr = (), MMA_STEP1: tl.constexpr = (), MMA_STORES1: tl.constexpr = (),
    MMA_WIDTHS3: tl.constexpr = (), MMA_SETUP3: tl.constexpr = (), MMA_FRAG3: tl.constexpr = (),
    MMA_LOADS3: tl.constexpr = (), MMA_STEP3: tl.constexpr = (), MMA_STORES3: tl.constexpr = (),
):  # fmt: skip
    pid_c = tl.program_id(0)
    p = tl.program_id(1)
    pid_s = tl.program_id(2)
    t, e, w = _pair(ids_ptr, wts_ptr, p, topk, n_routed)
    kt0, kt_per = _k_range(pid_s, KT, SPLIT)
    tn = NI // 16
    # Workspace per (pair, column block): SPLIT x [gate 128 | up 128] partials, then 128 scratch values.
    slot = (p * (NI // 128) + pid_c).to(tl.int64)
    slot_ws = ws_ptr + slot * (SPLIT * 256 + 128)
    if MMA:
        # The weights-as-A mma decode (exl3_mma), one row as its fp16 high / low pair xh[proj, p, 0 | 1].
        x1 = xh_ptr + 2 * p * D + kt0 * 16
        x3 = xh_ptr + 2 * (P + p) * D + kt0 * 16
        _mma_cols(t1_ptr, off1_ptr, wid1_ptr, e, kt0, kt_per, tn, pid_c, x1, D, slot_ws + pid_s * 256, MMA,
                  MMA_WIDTHS1, MMA_SETUP1, MMA_FRAG1, MMA_LOADS1, MMA_STEP1, MMA_STORES1)  # fmt: skip
        _mma_cols(t3_ptr, off3_ptr, wid3_ptr, e, kt0, kt_per, tn, pid_c, x3, D, slot_ws + pid_s * 256 + 128, MMA,
                  MMA_WIDTHS3, MMA_SETUP3, MMA_FRAG3, MMA_LOADS3, MMA_STEP3, MMA_STORES3)  # fmt: skip
    else:
        if FUSE:
            x1 = x_ptr + t * stride_x
            x3 = x1
        else:
            x1 = xh_ptr + p * D
            x3 = xh_ptr + (P + p) * D
        _expert_cols(t1_ptr, off1_ptr, wid1_ptr, cb1_ptr, e, pid_c, kt0, kt_per, tn, x1, suh1_ptr + e * D,
                     slot_ws + pid_s * 256, FUSE, W1, CB1, BK, PF, RUNS, TPE, RW1)  # fmt: skip
        _expert_cols(t3_ptr, off3_ptr, wid3_ptr, cb3_ptr, e, pid_c, kt0, kt_per, tn, x3, suh3_ptr + e * D,
                     slot_ws + pid_s * 256 + 128, FUSE, W3, CB3, BK, PF, RUNS, TPE, RW3)  # fmt: skip
    release_fence()
    last = pid_s >= 0
    if SPLIT > 1:
        last = tl.atomic_add(cnt_ptr + slot, 1, sem="acq_rel", scope="gpu") == SPLIT - 1
    if last:
        _gate_up_epilogue(slot_ws, SPLIT, e, w, p, pid_c, NI, limit, svh1_ptr, svh3_ptr, suh2_ptr, act_ptr,
                          MMA > 0, FLIGHT)  # fmt: skip
        if SPLIT > 1:
            tl.atomic_xchg(cnt_ptr + slot, 0)


@triton.jit
def _moe_down_kernel(
    ids_ptr, act_ptr, t2_ptr, off2_ptr, wid2_ptr, cb2_ptr, svh2_ptr, y_ptr, ws_ptr, cnt_ptr,
    D, NI, stride_y, topk, n_routed, KT,
    W2: tl.constexpr, CB2: tl.constexpr, BK: tl.constexpr, KS, NS,
    PF: tl.constexpr, RUNS2: tl.constexpr, TPE: tl.constexpr, MMA: tl.constexpr = 0, FLIGHT: tl.constexpr = 8,
    RW2: tl.constexpr = (),
    MMA_WIDTHS2: tl.constexpr = (), MMA_SETUP2: tl.constexpr = (), MMA_FRAG2: tl.constexpr = (),
    MMA_LOADS2: tl.constexpr = (), MMA_STEP2: tl.constexpr = (), MMA_STORES2: tl.constexpr = (),
):  # fmt: skip
    pid_c = tl.program_id(0)
    t = tl.program_id(1)
    s = tl.program_id(2)
    p = t * (topk + 1) + s // KS
    _, e, _ = _pair(ids_ptr, ids_ptr, p, topk, n_routed)
    kt0, kt_per = _k_range(s % KS, KT, KS)
    # Workspace per (token, column block): NS x [raw partial 128 | rotated and scaled partial 128].
    c = tl.arange(0, 128)
    cols = pid_c * 128 + c
    slot = (t * (D // 128) + pid_c).to(tl.int64)
    mine = ws_ptr + (slot * NS + s) * 256
    if MMA:  # the activation as its fp16 high / low pair act[p, 0 | 1] (the gate/up epilogue wrote it so)
        _mma_cols(t2_ptr, off2_ptr, wid2_ptr, e, kt0, kt_per, D // 16, pid_c, act_ptr + 2 * p * NI + kt0 * 16, NI,
                  mine, MMA, MMA_WIDTHS2, MMA_SETUP2, MMA_FRAG2, MMA_LOADS2, MMA_STEP2, MMA_STORES2)  # fmt: skip
    else:
        _expert_cols(t2_ptr, off2_ptr, wid2_ptr, cb2_ptr, e, pid_c, kt0, kt_per, D // 16, act_ptr + p * NI,
                     act_ptr, mine, False, W2, CB2, BK, PF, RUNS2, TPE, RW2)  # fmt: skip
    tl.debug_barrier()
    y = tl.sum(rotate_sum(mine, 1, 0, 0, 1), axis=0) * tl.load(svh2_ptr + e * D + cols).to(tl.float32)
    tl.store(mine + 128 + c, y)
    release_fence()
    if tl.atomic_add(cnt_ptr + slot, 1, sem="acq_rel", scope="gpu") == NS - 1:
        tot = sum_parts(ws_ptr + slot * NS * 256 + 128, NS, 256, FLIGHT)
        tl.store(y_ptr + t * stride_y + cols, tot.to(y_ptr.dtype.element_ty))
        tl.atomic_xchg(cnt_ptr + slot, 0)


@dataclass(frozen=True)
class MoeConfig:
    """Launch choices (None = chosen from the shape)."""

    split_gate_up: int | None = None
    split_down: int | None = None
    block_k: int | None = None  # k rows per loop iteration: 64 or 32 for the run decode, else 16
    fuse_rotation: bool = False
    prefetch: int = 4
    runs: bool | None = None  # 32-position runs (integer widths, one codebook per table; default where so)
    run_tiles: int | None = None  # run decode: n-tiles each element takes in turn (1, 2 or 4)
    num_warps: int | None = None  # 2 for the run decode, else 4
    num_stages: int = 1
    waves: float | None = None  # programs per SM the k-splits aim for: 16 or 8 (see moe_exl3)
    # the weights-as-A mma decode of exl3_mma, this many groups of two n-tiles per warp (1, 2 or 4; 0 = off):
    # integer widths and one codebook per table, a GPU; each pair's row goes in as an fp16 high / low pair,
    # a branch per width on ragged tables; None = MOE_MMA_GROUPS on one-width tables, MOE_MMA_GROUPS_RAGGED on
    # ragged tables of integer widths, else (half rates, mixed codebooks, the interpreter) the run decode
    mma: int | None = None
    # partials the last program of a column block loads at a time when it sums the k-splits (gate/up) and the
    # pairs' splits (down); more in flight, more registers in the whole kernel
    reduce_flight: int = 8


# The MoE's default mma groups on one-width tables: 4 groups 95.8 us, 2 groups 97.4, 1 group 113.0, the run
# decode 101.8 on a Flash layer's 4-bit stack (kernels_h200.md, run 24)
MOE_MMA_GROUPS = 4
# ... and on ragged tables of integer widths (the real packs' shape: routed 2-5 bit, shared 6 bit), where each
# launch branches per width: 2 groups 108.2 us, 4 groups 114.5 (120 / 104 registers), the run decode 122.8
# (kernels_h200.md, run 32)
MOE_MMA_GROUPS_RAGGED = 2
# Programs per SM the mma decode's k-splits aim for (kernels_h200.md). 4 groups (one-warp programs): 28 while
# gate/up held 100 registers (95.2 us, run 29); since the byte-permute cut it holds 104 (19 warps per SM) and 20 per
# SM measured best: 87.8 us against 88.7 at 16, 94.5 at 24, 91.5 at 28, 93.4 at 32 (run 37; 88.0 / 91.6 in run 38).
# 2 groups (two-warp programs, the ragged default): 12 per SM, ragged_q28 103.1 us against 107.4 at 16, 109.0 at
# 28, 116.9 at 8 (run 33). 1 group is not tuned (28, as before).
MOE_MMA_WAVES = {1: 28.0, 2: 12.0, 4: 20.0}


def _default_mma(uniform: bool, integer: bool) -> int:
    """The mma groups when MoeConfig.mma is None: one-width or ragged integer tables on a GPU, else 0 (run decode)."""
    if INTERPRET or not integer:
        return 0
    return MOE_MMA_GROUPS if uniform else MOE_MMA_GROUPS_RAGGED


def _mma_kw(table: ExpertTable, groups: int, suffix: str) -> dict:
    """The mma decode's constexprs for one projection's table (one row as a high / low pair): its widths and,
    at the same index, each width's PTX (G loads and stores per width)."""
    asms = [mma_asm(w, table.codebook, 1, groups, wt=True) for w in table.width_set]
    kw = {f"MMA_WIDTHS{suffix}": table.width_set}
    kw |= {f"{k}{suffix}": tuple(a[k] for a in asms) for k in ("MMA_SETUP", "MMA_FRAG", "MMA_STEP")}
    # one string per group, the widths one after another (constexpr tuples do not nest)
    return kw | {f"{k}{suffix}": sum((a[k] for a in asms), ()) for k in ("MMA_LOADS", "MMA_STORES")}


def _runs_apply(config: MoeConfig, table: ExpertTable) -> bool:
    """Whether a table takes the run decode: integer widths, one codebook, not switched off."""
    return config.runs is not False and table.codebook >= 0 and table.integer_widths


def moe_exl3(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: ExpertTable,
    w3: ExpertTable,
    w2: ExpertTable,
    swiglu_limit: float = 10.0,
    out_dtype: torch.dtype | None = None,
    config: MoeConfig = MoeConfig(),
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """y [T, D] = sum over each token's top-k experts (weights) and the shared expert (weight 1)."""
    tokens, d = x.shape
    topk = topk_ids.shape[1]
    inter = w1.n
    if (w1.k, w3.k, w3.n, w2.k, w2.n) != (d, d, inter, inter, d):
        raise ValueError(f"tables {w1.k}x{w1.n}, {w3.k}x{w3.n}, {w2.k}x{w2.n} do not fit x [., {d}]")
    if not w1.entries == w3.entries == w2.entries:
        raise ValueError("w1, w3 and w2 tables hold different numbers of entries")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != tokens or topk < 1:
        raise ValueError(
            f"topk_ids {tuple(topk_ids.shape)} / weights {tuple(topk_weights.shape)} vs {tokens} tokens"
        )
    x = x.contiguous()
    ids = topk_ids.contiguous()
    wts = topk_weights.contiguous()
    n_routed = w1.entries - 1
    pairs = tokens * (topk + 1)
    dev = x.device
    runs13 = _runs_apply(config, w1) and _runs_apply(config, w3)
    runs2 = _runs_apply(config, w2)
    # One width per table on the run decode: block_k 64, 4 tiles, 16 programs/SM (kernels_occupancy_h200.md);
    # mixed widths keep block_k 32, 2 tiles, 8/SM (runs 3-9; the new shape is not yet measured there).
    uniform = runs13 and runs2 and min(w1.width, w3.width, w2.width) > 0
    mma = config.mma if config.mma is not None else _default_mma(uniform, runs13 and runs2)
    if mma and (INTERPRET or not (runs13 and runs2)):
        raise ValueError("the MoE mma decode needs integer widths and one codebook per table, and a GPU")
    bk = 16 if mma else config.block_k or ((64 if uniform else 32) if runs13 or runs2 else 16)
    tiles = config.run_tiles or (4 if uniform else 2)
    warps = mma_warps(mma) if mma else config.num_warps or (2 if runs13 or runs2 else 4)
    sms = num_sms(dev)
    c1, c2 = inter // 128, d // 128
    waves = config.waves or (MOE_MMA_WAVES[mma] if mma else 16.0 if uniform else 8.0)
    if mma:  # one k-tile per step: any split, the k-tiles shared out as evenly as they go
        split1 = config.split_gate_up or even_split(d // 16, c1 * pairs, sms, waves)
        split2 = config.split_down or even_split(inter // 16, c2 * pairs, sms, waves)
    else:  # the run decode's steps take BK // 16 k-tiles: a split dividing the steps
        split1 = config.split_gate_up or pick_split(d // 16, bk // 16, c1 * pairs, sms, waves)
        split2 = config.split_down or pick_split(inter // 16, bk // 16, c2 * pairs, sms, waves)
    limit = float(swiglu_limit) if swiglu_limit and swiglu_limit > 0 else float("inf")
    y = out if out is not None else torch.empty((tokens, d), dtype=out_dtype or x.dtype, device=dev)
    if tuple(y.shape) != (tokens, d) or y.stride(1) != 1:
        raise ValueError(f"out {tuple(y.shape)} must be [{tokens}, {d}] with unit column stride")
    # the activation rotated for the down projection: fp32, or the mma decode's fp16 high / low pairs
    act = torch.empty((pairs, 2, inter) if mma else (pairs, inter), dtype=torch.float16 if mma else torch.float32,
                      device=dev)  # fmt: skip
    ns = (topk + 1) * split2
    ws1 = torch.empty((pairs * c1 * (split1 * 256 + 128),), dtype=torch.float32, device=dev)
    ws2 = torch.empty((tokens * c2 * ns * 256,), dtype=torch.float32, device=dev)
    fuse = config.fuse_rotation and not runs13
    xh = x
    if not fuse:
        shape = (2, pairs, 2, d) if mma else (2, pairs, d)
        xh = torch.empty(shape, dtype=torch.float16 if mma else torch.float32, device=dev)
        scratch = torch.empty((2, pairs, d), dtype=torch.float32, device=dev)
        _moe_rotate_kernel[(d // 128, pairs, 2)](
            x, ids, w1.suh, w3.suh, xh, scratch, pairs, d, x.stride(0), topk, n_routed, PAIRS=bool(mma)
        )  # fmt: skip
    cnt = counters(dev, pairs * c1 + tokens * c2)
    cnt1, cnt2 = cnt, cnt[pairs * c1 :]
    _moe_gate_up_kernel[(c1, pairs, split1)](
        x, ids, wts, xh,
        w1.words, w1.offsets, w1.widths, w1.codebooks, w1.suh, w1.svh,
        w3.words, w3.offsets, w3.widths, w3.codebooks, w3.suh, w3.svh,
        w2.suh, act, ws1, cnt1,
        pairs, d, inter, x.stride(0), topk, n_routed, d // 16, limit,
        W1=w1.width, CB1=w1.codebook, W3=w3.width, CB3=w3.codebook,
        BK=bk, SPLIT=split1, FUSE=fuse, PF=config.prefetch, RUNS=runs13, TPE=tiles,
        num_warps=warps, num_stages=config.num_stages, FLIGHT=config.reduce_flight,
        RW1=w1.width_set, RW3=w3.width_set, MMA=mma, **({**_mma_kw(w1, mma, "1"), **_mma_kw(w3, mma, "3")} if mma else {}),
    )  # fmt: skip
    _moe_down_kernel[(c2, tokens, ns)](
        ids, act, w2.words, w2.offsets, w2.widths, w2.codebooks, w2.svh, y, ws2, cnt2,
        d, inter, y.stride(0), topk, n_routed, inter // 16,
        W2=w2.width, CB2=w2.codebook, BK=bk, KS=split2, NS=ns, PF=config.prefetch, RUNS2=runs2, TPE=tiles,
        num_warps=warps, num_stages=config.num_stages, MMA=mma, FLIGHT=config.reduce_flight, RW2=w2.width_set,
        **(_mma_kw(w2, mma, "2") if mma else {}),
    )  # fmt: skip
    return y


def moe_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w1: list[torch.Tensor],
    w3: list[torch.Tensor],
    w2: list[torch.Tensor],
    swiglu_limit: float = 10.0,
) -> torch.Tensor:
    """Torch reference in float64 from dense weights [k, n] per entry (shared expert last)."""
    shared = len(w1) - 1
    xd = x.double()
    y = torch.zeros((x.shape[0], w2[shared].shape[1]), dtype=torch.float64, device=x.device)
    for t in range(x.shape[0]):
        slots = [
            (int(e), float(w)) for e, w in zip(topk_ids[t].tolist(), topk_weights[t].tolist(), strict=True)
        ]
        for e, w in [*slots, (shared, 1.0)]:
            g = xd[t] @ w1[e].double()
            u = xd[t] @ w3[e].double()
            if swiglu_limit and swiglu_limit > 0:
                g = g.clamp(max=swiglu_limit)
                u = u.clamp(-swiglu_limit, swiglu_limit)
            act = torch.nn.functional.silu(g) * u * w
            y[t] += act @ w2[e].double()
    return y
