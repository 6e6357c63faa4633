"""EXL3 MoE over expert tables: clamped SwiGLU experts (w1 gate, w3 up, w2 down) + the shared expert.

For each token t and slot j (top-k routed experts, then the shared expert = the table's last entry with
weight 1) the pair computes act = silu(min(x W1, L)) * clamp(x W3, -L, L) * weight (fp32, the routing weight
multiplies the activation before the down projection, as the reference does) and y[t] += act W2.
Launches: the pairs ordered by expert (moe_order: groups of up to 4 pairs of one expert; none for one token,
whose pairs never share an expert: pair i is then group i), the input rotation
(all pairs, both w1 and w3, by sorted position), one fused gate+up launch whose epilogue applies SwiGLU and the
down projection's input rotation, and one down launch whose last program per (token, 128 columns) sums the pairs
in slot order. A program takes a group: the mma decode decodes each tile once for its rows (each row an fp16 high /
low pair, 4 rows fill the mma's 8 columns), so a step reads an expert's bytes once per 4 rows that picked it,
and a row's sums never depend on the rows beside it. No Python loop over experts. The decode is the 32-position
run decode (exl3_runs) or the per-element gather (a row at a time), or (MoeConfig.mma, the GPU default on tables
of integer widths) the weights-as-A mma decode of exl3_mma; the kernels' pieces are in moe_tl.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3.expert_table import ExpertTable
from tfc.kernels.exl3.fixed import fixed_parts
from tfc.kernels.exl3.launch import counters, even_split, num_sms, pick_split
from tfc.kernels.exl3.mma import mma_asm, mma_warps
from tfc.kernels.exl3.moe_order import GROUP_PAIRS, group_at, order_pairs, pair_at
from tfc.kernels.exl3.moe_tl import expert_cols, gate_up_epilogue, k_range, mma_cols, pair
from tfc.kernels.exl3.tl import INTERPRET, release_fence, rotate_sum, store_pair, sum_parts


@triton.jit
def _group(i, ids_ptr, order_ptr, end_ptr, lead_ptr, nlead_ptr, topk, n_routed, GROUP: tl.constexpr,
           SORTED: tl.constexpr):  # fmt: skip
    """(whether program i has a group, its first sorted position, its pairs, their table entry)."""
    live, s, n = group_at(i, end_ptr, lead_ptr, nlead_ptr, GROUP, SORTED)
    return live, s, n, pair(ids_ptr, ids_ptr, pair_at(order_ptr, s, SORTED), topk, n_routed)[1]


@triton.jit
def _moe_rotate_kernel(x_ptr, ids_ptr, order_ptr, suh1_ptr, suh3_ptr, xh_ptr, ws_ptr, P, D, stride_x, topk,
                       n_routed, PAIRS: tl.constexpr = False, SORTED: tl.constexpr = True):  # fmt: skip
    """xh[proj, s, blk] = had128(x[t, blk] * suh_proj[e, blk]) for w1 (proj 0) and w3 (proj 1) of the pair at
    sorted position s; PAIRS: as the fp16 high / low row pair xh[proj, s, 0 | 1, blk] the mma decode reads."""
    blk = tl.program_id(0)
    s = tl.program_id(1)
    proj = tl.program_id(2)
    t, e, _ = pair(ids_ptr, ids_ptr, pair_at(order_ptr, s, SORTED), topk, n_routed)
    cols = blk * 128 + tl.arange(0, 128)
    if proj == 0:
        su = tl.load(suh1_ptr + e * D + cols)
    else:
        su = tl.load(suh3_ptr + e * D + cols)
    a = tl.load(x_ptr + t * stride_x + cols).to(tl.float32) * su.to(tl.float32)
    row = (proj * P + s) * D + blk * 128
    tl.store(ws_ptr + row + tl.arange(0, 128), a)
    tl.debug_barrier()
    xh = rotate_sum(ws_ptr + row, 1, 0, 0, 1)
    if PAIRS:
        i = tl.arange(0, 128)
        store_pair(xh_ptr + 2 * (proj * P + s) * D + blk * 128 + i, D, tl.reshape(xh, (128,)), i >= 0)
    else:
        tl.store(xh_ptr + row + tl.arange(0, 128)[None, :], xh)


@triton.jit
def _moe_gate_up_kernel(
    ids_ptr, wts_ptr, xh_ptr, order_ptr, end_ptr, lead_ptr, nlead_ptr,
    t1_ptr, off1_ptr, wid1_ptr, cb1_ptr, svh1_ptr,
    t3_ptr, off3_ptr, wid3_ptr, cb3_ptr, svh3_ptr,
    suh2_ptr, act_ptr, ws_ptr, scr_ptr, cnt_ptr,
    P, D, NI, topk, n_routed, KT, limit,
    W1: tl.constexpr, CB1: tl.constexpr, W3: tl.constexpr, CB3: tl.constexpr,
    BK: tl.constexpr, PF: tl.constexpr, SPLIT, RUNS: tl.constexpr,
    TPE: tl.constexpr, GROUP: tl.constexpr, MMA: tl.constexpr = 0, FLIGHT: tl.constexpr = 8,
    RW1: tl.constexpr = (), RW3: tl.constexpr = (), SORTED: tl.constexpr = True,
    MMA_WIDTHS1: tl.constexpr = (), MMA_SETUP1: tl.constexpr = (), MMA_FRAG1: tl.constexpr = (),
    MMA_LOADS1: tl.constexpr = (), MMA_STEP1: tl.constexpr = (), MMA_STORES1: tl.constexpr = (),
    MMA_WIDTHS3: tl.constexpr = (), MMA_SETUP3: tl.constexpr = (), MMA_FRAG3: tl.constexpr = (),
    MMA_LOADS3: tl.constexpr = (), MMA_STEP3: tl.constexpr = (), MMA_STORES3: tl.constexpr = (),
):  # fmt: skip
    """Gate and up of one group (up to GROUP pairs of one expert at sorted positions s..), one 128-column block,
    one k-split: each tile decoded once for the group's rows; the last split of the block runs the epilogue."""
    pid_c = tl.program_id(0)
    pid_s = tl.program_id(2)
    live, s, n, e = _group(tl.program_id(1), ids_ptr, order_ptr, end_ptr, lead_ptr, nlead_ptr, topk, n_routed,
                           GROUP, SORTED)  # fmt: skip
    if live:
        kt0, kt_per = k_range(pid_s, KT, SPLIT)
        tn = NI // 16
        # Partials [gate | up][split][column block][position][128]: a group's rows are consecutive positions.
        part = (NI // 128) * P * 128
        gate = ws_ptr + (pid_s * (NI // 128) + pid_c).to(tl.int64) * P * 128 + s.to(tl.int64) * 128
        up = gate + SPLIT * part
        if MMA:
            # The weights-as-A mma decode (exl3_mma), each row as its fp16 high / low pair xh[proj, s, 0 | 1].
            x1 = xh_ptr + 2 * s * D + kt0 * 16
            x3 = xh_ptr + 2 * (P + s) * D + kt0 * 16
            mma_cols(t1_ptr, off1_ptr, wid1_ptr, e, kt0, kt_per, tn, pid_c, x1, D, gate, 2 * n, MMA, MMA_WIDTHS1,
                     MMA_SETUP1, MMA_FRAG1, MMA_LOADS1, MMA_STEP1, MMA_STORES1)  # fmt: skip
            mma_cols(t3_ptr, off3_ptr, wid3_ptr, e, kt0, kt_per, tn, pid_c, x3, D, up, 2 * n, MMA, MMA_WIDTHS3,
                     MMA_SETUP3, MMA_FRAG3, MMA_LOADS3, MMA_STEP3, MMA_STORES3)  # fmt: skip
        else:  # the run or gather decode takes one row at a time
            for q in range(n):
                expert_cols(t1_ptr, off1_ptr, wid1_ptr, cb1_ptr, e, pid_c, kt0, kt_per, tn,
                            xh_ptr + (s + q) * D, gate + q * 128, W1, CB1, BK, PF, RUNS, TPE, RW1)  # fmt: skip
                expert_cols(t3_ptr, off3_ptr, wid3_ptr, cb3_ptr, e, pid_c, kt0, kt_per, tn,
                            xh_ptr + (P + s + q) * D, up + q * 128, W3, CB3, BK, PF, RUNS, TPE, RW3)  # fmt: skip
        release_fence()
        slot = s * (NI // 128) + pid_c
        last = pid_s >= 0
        if SPLIT > 1:
            last = tl.atomic_add(cnt_ptr + slot, 1, sem="acq_rel", scope="gpu") == SPLIT - 1
        if last:
            gate0 = ws_ptr + pid_c.to(tl.int64) * P * 128 + s.to(tl.int64) * 128
            for q in range(n):
                w = pair(ids_ptr, wts_ptr, pair_at(order_ptr, s + q, SORTED), topk, n_routed)[2]
                gate_up_epilogue(gate0 + q * 128, gate0 + SPLIT * part + q * 128, part, SPLIT,
                                 scr_ptr + (slot + q * (NI // 128)).to(tl.int64) * 128, e, w, s + q, pid_c, NI,
                                 limit, svh1_ptr, svh3_ptr, suh2_ptr, act_ptr, MMA > 0, FLIGHT)  # fmt: skip
            if SPLIT > 1:
                tl.atomic_xchg(cnt_ptr + slot, 0)


@triton.jit
def _moe_down_kernel(
    ids_ptr, order_ptr, end_ptr, lead_ptr, nlead_ptr, act_ptr, t2_ptr, off2_ptr, wid2_ptr, cb2_ptr, svh2_ptr,
    y_ptr, raw_ptr, ws_ptr, cnt_ptr,
    P, D, NI, stride_y, topk, n_routed, KT,
    W2: tl.constexpr, CB2: tl.constexpr, BK: tl.constexpr, KS, NS,
    PF: tl.constexpr, RUNS2: tl.constexpr, TPE: tl.constexpr, GROUP: tl.constexpr, MMA: tl.constexpr = 0,
    FLIGHT: tl.constexpr = 8, RW2: tl.constexpr = (),
    MMA_WIDTHS2: tl.constexpr = (), MMA_SETUP2: tl.constexpr = (), MMA_FRAG2: tl.constexpr = (),
    MMA_LOADS2: tl.constexpr = (), MMA_STEP2: tl.constexpr = (), MMA_STORES2: tl.constexpr = (),
    FIXED: tl.constexpr = False, PLANE=0, SORTED: tl.constexpr = True,
):  # fmt: skip
    """The down projection of one group, one 128-column block, one k-split: each tile decoded once for the group's
    rows; every pair's rotated partial goes to its token's slot, whose last arrival sums them in slot order."""
    pid_c = tl.program_id(0)
    ks = tl.program_id(2)
    live, s, n, e = _group(tl.program_id(1), ids_ptr, order_ptr, end_ptr, lead_ptr, nlead_ptr, topk, n_routed,
                           GROUP, SORTED)  # fmt: skip
    if live:
        kt0, kt_per = k_range(ks, KT, KS)
        raw = raw_ptr + (ks * (D // 128) + pid_c).to(tl.int64) * P * 128 + s.to(tl.int64) * 128
        if MMA:  # the activations as fp16 high / low pairs act[s, 0 | 1] (the gate/up epilogue wrote them so)
            mma_cols(t2_ptr, off2_ptr, wid2_ptr, e, kt0, kt_per, D // 16, pid_c, act_ptr + 2 * s * NI + kt0 * 16,
                     NI, raw, 2 * n, MMA, MMA_WIDTHS2, MMA_SETUP2, MMA_FRAG2, MMA_LOADS2, MMA_STEP2,
                     MMA_STORES2)  # fmt: skip
        else:
            for q in range(n):
                expert_cols(t2_ptr, off2_ptr, wid2_ptr, cb2_ptr, e, pid_c, kt0, kt_per, D // 16,
                            act_ptr + (s + q) * NI, raw + q * 128, W2, CB2, BK, PF, RUNS2, TPE, RW2)  # fmt: skip
        tl.debug_barrier()
        c = tl.arange(0, 128)
        cols = pid_c * 128 + c
        scale = tl.load(svh2_ptr + e * D + cols).to(tl.float32)
        for q in range(n):
            p = pair_at(order_ptr, s + q, SORTED)
            t = p // (topk + 1)
            # Token slots [token][column block][NS partials: slot j, split ks][128], summed in that order.
            slot = (t * (D // 128) + pid_c).to(tl.int64)
            y = tl.sum(rotate_sum(raw + q * 128, 1, 0, 0, 1), axis=0) * scale
            tl.store(ws_ptr + (slot * NS + (p % (topk + 1)) * KS + ks) * 128 + c, y)
            release_fence()
            if tl.atomic_add(cnt_ptr + slot, 1, sem="acq_rel", scope="gpu") == NS - 1:
                if FIXED:  # y is int64 [2, T, D]: the words of every part, summed as integers
                    hi, lo = fixed_parts(ws_ptr + slot * NS * 128, NS, 128)
                    tl.store(y_ptr + t * stride_y + cols, hi)
                    tl.store(y_ptr + PLANE + t * stride_y + cols, lo)
                else:
                    tot = sum_parts(ws_ptr + slot * NS * 128, NS, 128, FLIGHT)
                    tl.store(y_ptr + t * stride_y + cols, tot.to(y_ptr.dtype.element_ty))
                tl.atomic_xchg(cnt_ptr + slot, 0)


@dataclass(frozen=True)
class MoeConfig:
    """Launch choices (None = chosen from the shape) and the tuned values those choices follow
    (benchmarks/summaries/kernels.md)."""

    split_gate_up: int | None = None
    split_down: int | None = None
    block_k: int | None = None  # k rows per loop iteration: 64 or 32 for the run decode, else 16
    runs: bool | None = None  # 32-position runs (integer widths, one codebook per table; default where so)
    run_tiles: int | None = None  # run decode: n-tiles each element takes in turn (1, 2 or 4)
    num_warps: int | None = None  # 2 for the run decode, else 4
    waves: float | None = None  # programs per SM the k-splits aim for: 16 or 8 (see moe_exl3)
    # the weights-as-A mma decode of exl3_mma, this many groups of two n-tiles per warp (1, 2 or 4; 0 = off):
    # integer widths and one codebook per table, a GPU; each pair's row goes in as an fp16 high / low pair,
    # a branch per width on ragged tables; None = mma_groups on one-width tables, mma_groups_ragged on
    # ragged tables of integer widths, else (half rates, mixed codebooks, the interpreter) the run decode
    mma: int | None = None
    # The default mma groups on one-width tables (4 ahead of 2, 1 and the run decode on a Flash layer's 4-bit
    # stack) ...
    mma_groups: int = 4
    # ... and on ragged tables of integer widths (the real packs' shape: routed 2-5 bit, shared 6 bit), where
    # each launch branches per width and 4 groups cost more registers than they gain.
    mma_groups_ragged: int = 2
    # Programs per SM the mma decode's k-splits aim for, by groups: each the best of its sweep (1 group is not
    # tuned).
    mma_waves: tuple[tuple[int, float], ...] = ((1, 28.0), (2, 12.0), (4, 20.0))
    # Partials the last program of a column block sums at a time (the k-splits on gate/up, the pairs' splits on
    # down): more in flight costs the main loop registers.
    reduce_flight: int = 8
    prefetch: int = 4  # the gather decode's L2 prefetch distance, in loop iterations


@dataclass(frozen=True)
class _Launch:
    """What moe_exl3 launches with, by the tables and the config (k-splits apart)."""

    runs13: bool
    runs2: bool
    mma: int
    block_k: int
    tiles: int
    warps: int
    waves: float


def _launch(config: MoeConfig, w1: ExpertTable, w3: ExpertTable, w2: ExpertTable) -> _Launch:
    """The decode, k step, tiles, warps and waves of a launch over these tables."""
    runs13 = _runs_apply(config, w1) and _runs_apply(config, w3)
    runs2 = _runs_apply(config, w2)
    # One width per table on the run decode: block_k 64, 4 tiles, 16 programs/SM; mixed widths block_k 32, 2
    # tiles, 8/SM.
    uniform = runs13 and runs2 and min(w1.width, w3.width, w2.width) > 0
    mma = config.mma
    if mma is None and (INTERPRET or not (runs13 and runs2)):
        mma = 0
    elif mma is None:
        mma = config.mma_groups if uniform else config.mma_groups_ragged
    if mma and (INTERPRET or not (runs13 and runs2)):
        raise ValueError("the MoE mma decode needs integer widths and one codebook per table, and a GPU")
    bk = 16 if mma else config.block_k or ((64 if uniform else 32) if runs13 or runs2 else 16)
    warps = mma_warps(mma) if mma else config.num_warps or (2 if runs13 or runs2 else 4)
    waves = config.waves or (dict(config.mma_waves)[mma] if mma else 16.0 if uniform else 8.0)
    return _Launch(runs13, runs2, mma, bk, config.run_tiles or (4 if uniform else 2), warps, waves)


def _splits(launch: _Launch, d: int, inter: int, pairs: int, sms: int) -> tuple[int, int]:
    """The gate/up and down k-splits for `pairs` pairs (the mma decode shares its k-tiles out evenly; the run
    decode's steps take block_k / 16 k-tiles, so its split divides the steps)."""
    c1, c2, waves = inter // 128, d // 128, launch.waves
    if launch.mma:
        return even_split(d // 16, c1 * pairs, sms, waves), even_split(inter // 16, c2 * pairs, sms, waves)
    bkt = launch.block_k // 16
    split1 = pick_split(d // 16, bkt, c1 * pairs, sms, waves)
    return split1, pick_split(inter // 16, bkt, c2 * pairs, sms, waves)


def pinned_config(w1: ExpertTable, w3: ExpertTable, w2: ExpertTable, topk: int, device: torch.device,
                  inter: int | None = None, config: MoeConfig = MoeConfig()) -> MoeConfig:  # fmt: skip
    """The launch moe_exl3 picks for one token's pairs, pinned (k-splits, decode) for any number of tokens;
    `inter`: the whole expert width a tensor-parallel rank's share of it is pinned to (default: the table's)."""
    launch = _launch(config, w1, w3, w2)
    s1, s2 = _splits(launch, w1.k, inter or w1.n, topk + 1, num_sms(device))
    return replace(config, split_gate_up=s1, split_down=s2, block_k=launch.block_k, mma=launch.mma,
                   waves=launch.waves)  # fmt: skip


def _mma_kw(table: ExpertTable, groups: int, suffix: str) -> dict:
    """The mma decode's constexprs for one projection's table (a group's rows as high / low pairs): its widths
    and, at the same index, each width's PTX (G loads and stores per width)."""
    asms = [mma_asm(w, table.codebook, GROUP_PAIRS, groups, wt=True) for w in table.width_set]
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
    fixed: bool = False,
) -> torch.Tensor:
    """y [T, D] = sum over each token's top-k experts (weights) and the shared expert (weight 1).

    `fixed=True`: y as a fixed-point sum int64 [2, T, D] (kernels/exl3/fixed.py) of one down partial per pair and
    128-row block of the expert width (split_down forced to width / 128), which a row-parallel rank adds to the
    other ranks' by an integer all-reduce before exl3_fixed.fixed_value."""
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
    launch = _launch(config, w1, w3, w2)
    runs13, runs2, mma, bk, tiles, warps = (launch.runs13, launch.runs2, launch.mma, launch.block_k, launch.tiles,
                                            launch.warps)  # fmt: skip
    c1, c2 = inter // 128, d // 128
    split1, split2 = _splits(launch, d, inter, pairs, num_sms(dev))
    split1, split2 = config.split_gate_up or split1, config.split_down or split2
    if fixed:
        if inter % 128:
            raise ValueError(f"fixed: the expert width {inter} is not whole 128-row blocks")
        split2 = inter // 128
    limit = float(swiglu_limit) if swiglu_limit and swiglu_limit > 0 else float("inf")
    want = (2, tokens, d) if fixed else (tokens, d)
    y = out if out is not None else torch.empty(want, dtype=torch.int64 if fixed else out_dtype or x.dtype,
                                                 device=dev)  # fmt: skip
    if tuple(y.shape) != want or y.stride(-1) != 1 or (fixed and not y.is_contiguous()):
        raise ValueError(f"out {tuple(y.shape)} must be {list(want)} with unit column stride")
    order = order_pairs(ids, n_routed, GROUP_PAIRS)
    groups = pairs if order is None else order.bound
    # the activation rotated for the down projection (by sorted position): fp32, or the mma decode's fp16 pairs
    act = torch.empty((pairs, 2, inter) if mma else (pairs, inter), dtype=torch.float16 if mma else torch.float32,
                      device=dev)  # fmt: skip
    ns = (topk + 1) * split2
    ws1 = torch.empty((2 * split1 * c1 * pairs * 128,), dtype=torch.float32, device=dev)
    scr1 = torch.empty((pairs * c1 * 128,), dtype=torch.float32, device=dev)
    raw2 = torch.empty((split2 * c2 * pairs * 128,), dtype=torch.float32, device=dev)
    ws2 = torch.empty((tokens * c2 * ns * 128,), dtype=torch.float32, device=dev)
    xh = torch.empty((2, pairs, 2, d) if mma else (2, pairs, d), dtype=torch.float16 if mma else torch.float32,
                     device=dev)  # fmt: skip
    scratch = torch.empty((2, pairs, d), dtype=torch.float32, device=dev)
    # one token: pair i is group i, unsorted (the order's pointers go unread)
    lead = (ids, ids, ids, ids) if order is None else (order.order, order.end, order.leaders, order.nleaders)
    sort = {"SORTED": order is not None}
    _moe_rotate_kernel[(d // 128, pairs, 2)](
        x, ids, lead[0], w1.suh, w3.suh, xh, scratch, pairs, d, x.stride(0), topk, n_routed, PAIRS=bool(mma), **sort
    )  # fmt: skip
    cnt = counters(dev, pairs * c1 + tokens * c2)
    cnt1, cnt2 = cnt, cnt[pairs * c1 :]
    _moe_gate_up_kernel[(c1, groups, split1)](
        ids, wts, xh, *lead,
        w1.words, w1.offsets, w1.widths, w1.codebooks, w1.svh,
        w3.words, w3.offsets, w3.widths, w3.codebooks, w3.svh,
        w2.suh, act, ws1, scr1, cnt1,
        pairs, d, inter, topk, n_routed, d // 16, limit,
        W1=w1.width, CB1=w1.codebook, W3=w3.width, CB3=w3.codebook,
        BK=bk, SPLIT=split1, PF=config.prefetch, RUNS=runs13, TPE=tiles, GROUP=GROUP_PAIRS,
        num_warps=warps, num_stages=1, FLIGHT=config.reduce_flight,
        RW1=w1.width_set, RW3=w3.width_set, MMA=mma, **sort,
        **({**_mma_kw(w1, mma, "1"), **_mma_kw(w3, mma, "3")} if mma else {}),
    )  # fmt: skip
    _moe_down_kernel[(c2, groups, split2)](
        ids, *lead, act, w2.words, w2.offsets, w2.widths, w2.codebooks, w2.svh, y, raw2, ws2, cnt2,
        pairs, d, inter, y.stride(-2), topk, n_routed, inter // 16,
        W2=w2.width, CB2=w2.codebook, BK=bk, KS=split2, NS=ns, PF=config.prefetch, RUNS2=runs2, TPE=tiles,
        GROUP=GROUP_PAIRS, num_warps=warps, num_stages=1, MMA=mma, FLIGHT=config.reduce_flight,
        RW2=w2.width_set, FIXED=fixed, PLANE=tokens * d, **sort, **(_mma_kw(w2, mma, "2") if mma else {}),
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
