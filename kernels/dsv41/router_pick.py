"""The MoE router's split3 and pick and the indexer's select as plain Triton kernels (no torch.compile).

`split3` (runtime/models/dsv41/fast/moe.py): x fp32 [R, D] as three bf16 (or fp16) parts [3R, D], hi = x
rounded, mid = (x - hi) rounded, lo = (x - hi - mid) rounded. One elementwise launch; bit-exact against torch:
the differences are exact fp32 subtractions and every rounding is to nearest even. bf16 rounds on the bits
(b + 0x7FFF + bit 16 of b, the low 16 bits cleared: torch's CPU cast) and stores the high halves: the
interpreter's fp32 -> bf16 cast truncates and mishandles subnormals (on a GPU it is cvt.rn, the same
rounding). fp16 uses the cast (cvt.rn.f16.f32 on a GPU, numpy's round-to-nearest-even in the interpreter).
Finite inputs only (fp16: |x| < 65504).

`pick` (moe.py): logits = (p[:R] + p[R:2R]) + p[2R:] of the split product (or the logits as given), scores =
sqrt(softplus(logits)), softplus = log1p(exp(x)) with torch's threshold (x > 20: x); the top-k of scores +
bias by k rounds of (the largest, the lowest expert attaining it, masked out), which is the stable descending
sort; the picked scores over (their sum in pick order + 1e-20) when normalising, times scaling. One program
holds ROWS rows of E <= 1024 experts (ROWS follows E only). sqrt and the division round correctly (sqrt_rn,
div_rn), so the only difference from torch is softplus: on a GPU libdevice's expf / log1pf, the CUDA math
library that torch's CUDA kernel calls (Triton builds it flush-to-zero: subnormal exp(x), x < -87, read 0); in
the interpreter numpy's exp and log1p(e) = log(1 + e) * e / ((1 + e) - 1). Weights agree with torch to a few
ulps (tests: relative 2e-6), expert ids exactly except where two scores + bias lie within those few ulps of
each other.

`select` (runtime/models/dsv41/fast/compressed.py): the top-k visible (and candidate) entries of a row's scores
by a stable descending sort, entries past the k-th real one reading (0, False). Each entry is one int64 key (the
score's bits in an order-preserving int32, -0.0 as +0.0, then the inverted column), so one bitonic top-k
(tl.topk; tl.sort where the Triton lacks it) of distinct keys gives the stable order exactly. One program a row
over up to MAX_COLUMNS entries; wider rows or other score dtypes run the stage's torch code. Candidate making
(compressed.candidate_mask) is in the kernel where a row's blocks are at most top_blocks (the stage then keeps
every block holding a real entry, and the newest block) and a block is a power of two entries; otherwise the
stage's torch code runs. Scores must not be NaN (torch would sort a NaN first).

A row's results never depend on R or on the other rows: grids over rows, blocks fixed by the trailing sizes,
no atomics; launches only (CUDA-graph safe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3.tl import INTERPRET
from triton.language.extra import libdevice

# libdevice's expf / log1pf on a GPU; the interpreter has no libdevice: numpy's exp and a log1p made of log.
NATIVE = not INTERPRET
HAS_TOPK = hasattr(tl, "topk")  # Triton versions before tl.topk sort the whole row
MAX_EXPERTS = 1024
MAX_COLUMNS = 16384  # select's widest row in one program (int64 keys in registers)
_INT64_MIN = tl.constexpr(-(2**63))


@dataclass(frozen=True)
class PickConfig:
    """Launch values of split3 and select (any of them gives the same bits)."""

    split_block: int = 2048  # elements per split3 program
    # select's warps a row: one per this many columns, up to 16 (benchmarks/summaries/decode.md; its keys are
    # distinct, so any count gives the same picks)
    select_columns_a_warp: int = 64


@triton.jit
def _round_bf16(x):
    """The bits of fp32 x rounded to the nearest bf16 (ties to even), in an int32's high half; finite x."""
    b = x.to(tl.int32, bitcast=True)
    return (b + 0x7FFF + ((b >> 16) & 1)) & -65536


@triton.jit
def _split3_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr, BF16: tl.constexpr):
    """out[:N], out[N:2N], out[2N:] = hi, mid, lo of x's N elements (BF16: out holds the bits as int16)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < N
    x = tl.load(x_ptr + offs, mask=keep, other=0.0)
    if BF16:  # stored as bits: the interpreter's bf16 cast mishandles subnormals, and a cast is not needed
        hi = _round_bf16(x)
        d = x - hi.to(tl.float32, bitcast=True)
        mid = _round_bf16(d)
        lo = _round_bf16(d - mid.to(tl.float32, bitcast=True))
        tl.store(out_ptr + offs, (hi >> 16).to(tl.int16), mask=keep)
        tl.store(out_ptr + N + offs, (mid >> 16).to(tl.int16), mask=keep)
        tl.store(out_ptr + 2 * N + offs, (lo >> 16).to(tl.int16), mask=keep)
    else:
        hi = x.to(tl.float16)
        d = x - hi.to(tl.float32)
        mid = d.to(tl.float16)
        tl.store(out_ptr + offs, hi, mask=keep)
        tl.store(out_ptr + N + offs, mid, mask=keep)
        tl.store(out_ptr + 2 * N + offs, (d - mid.to(tl.float32)).to(tl.float16), mask=keep)


def split3(x: torch.Tensor, dtype: torch.dtype, config: PickConfig = PickConfig()) -> torch.Tensor:
    """[3R, D] in dtype (bf16 or fp16): hi, mid, lo of x fp32 [R, D], bit-exact as moe.split3."""
    if x.dim() != 2 or x.dtype != torch.float32 or dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"split3 takes fp32 [R, D] to bf16 or fp16: {x.dtype} {tuple(x.shape)} to {dtype}")
    x = x.contiguous()
    out = torch.empty(3 * x.shape[0], x.shape[1], dtype=dtype, device=x.device)
    n = x.numel()
    if n:
        bf16 = dtype == torch.bfloat16
        _split3_kernel[(triton.cdiv(n, config.split_block),)](
            x, out.view(torch.int16) if bf16 else out, n, BLOCK=config.split_block, BF16=bf16, num_warps=4
        )
    return out


@triton.jit
def _order_key(v, col):
    """int64 keys ordered as (v descending, col ascending) of fp32 v and int32 columns col; -0.0 as +0.0."""
    b = tl.where(v == 0.0, 0.0, v).to(tl.int32, bitcast=True)
    ordered = b ^ ((b >> 31) & 0x7FFFFFFF)  # signed order of the ints = order of the floats
    return (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - col).to(tl.int64)


@triton.jit
def _key_column(key):
    """The column of an _order_key key."""
    return (0x7FFFFFFF - (key & 0x7FFFFFFF)).to(tl.int32)


@triton.jit
def _softplus(x, NATIVE: tl.constexpr):
    """torch's softplus of fp32 x: log1p(exp(x)), x itself above 20."""
    t = tl.minimum(x, 20.0)
    if NATIVE:
        soft = libdevice.log1p(libdevice.exp(t))
    else:
        e = tl.exp(t)
        u = 1.0 + e
        d = u - 1.0
        soft = tl.where(d == 0.0, e, tl.log(u) * (e / tl.where(d == 0.0, 1.0, d)))
    return tl.where(x > 20.0, x, soft)


@triton.jit
def _pick_kernel(prod_ptr, bias_ptr, w_ptr, ids_ptr, R, stride, part, scaling, E: tl.constexpr,
                 BLOCK_E: tl.constexpr, K: tl.constexpr, BLOCK_K: tl.constexpr, ROWS: tl.constexpr,
                 SPLIT: tl.constexpr, NORMALISE: tl.constexpr, NATIVE: tl.constexpr):  # fmt: skip
    """(weights, expert ids) [R, K] of ROWS rows of logits (SPLIT: the sum of three blocks `part` apart)."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    e = tl.arange(0, BLOCK_E)
    cols = e[None, :] < E
    live = (r[:, None] < R) & cols
    at = r[:, None].to(tl.int64) * stride + e[None, :]
    logits = tl.load(prod_ptr + at, mask=live, other=0.0)
    if SPLIT:
        logits = (logits + tl.load(prod_ptr + part + at, mask=live, other=0.0)) + tl.load(
            prod_ptr + 2 * part + at, mask=live, other=0.0
        )
    scores = tl.sqrt_rn(_softplus(logits, NATIVE))
    bias = tl.load(bias_ptr + e, mask=e < E, other=0.0).to(tl.float32)
    key = tl.where(cols, _order_key(scores + bias[None, :], e[None, :]), _INT64_MIN)
    kk = tl.arange(0, BLOCK_K)[None, :]
    weights = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([ROWS, BLOCK_K], dtype=tl.int32)
    total = tl.zeros([ROWS], dtype=tl.float32)
    for j in tl.static_range(K):
        best = tl.max(key, axis=1)
        hit = key == best[:, None]
        p = tl.sum(tl.where(hit, scores, 0.0), axis=1)  # the one hit's score, exactly
        total += p
        weights = tl.where(kk == j, p[:, None], weights)
        ids = tl.where(kk == j, _key_column(best)[:, None], ids)
        key = tl.where(hit, _INT64_MIN, key)
    if NORMALISE:
        weights = tl.math.div_rn(weights, total[:, None] + 1e-20)
    weights = weights * scaling
    out = r[:, None].to(tl.int64) * K + kk
    keep = (r[:, None] < R) & (kk < K)
    tl.store(w_ptr + out, weights, mask=keep)
    tl.store(ids_ptr + out, ids.to(tl.int64), mask=keep)


def pick(prod: torch.Tensor, split: bool, bias: torch.Tensor, top_k: int, scaling: float, normalise: bool):
    """(weights fp32 [R, k], expert ids int64 [R, k]) as moe.pick of logits [R, E] or (split) [3R, E]."""
    if prod.dim() != 2 or prod.dtype != torch.float32 or (split and prod.shape[0] % 3):
        raise ValueError(f"pick takes fp32 [R, E] or [3R, E] (split): {prod.dtype} {tuple(prod.shape)}")
    experts = prod.shape[1]
    if tuple(bias.shape) != (experts,) or not 1 <= top_k <= experts or experts > MAX_EXPERTS:
        raise ValueError(
            f"pick needs bias [E], 1 <= top_k <= E <= {MAX_EXPERTS}: {tuple(bias.shape)}, {top_k}"
        )
    if prod.stride(1) != 1:
        prod = prod.contiguous()
    rows = prod.shape[0] // 3 if split else prod.shape[0]
    weights = torch.empty(rows, top_k, dtype=torch.float32, device=prod.device)
    ids = torch.empty(rows, top_k, dtype=torch.int64, device=prod.device)
    if rows:
        block_e = triton.next_power_of_2(experts)
        per = max(1, min(16, 1024 // block_e))  # rows per program: by E only
        _pick_kernel[(triton.cdiv(rows, per),)](
            prod, bias.contiguous(), weights, ids, rows, prod.stride(0), rows * prod.stride(0),
            float(scaling), E=experts, BLOCK_E=block_e, K=top_k, BLOCK_K=triton.next_power_of_2(top_k),
            ROWS=per, SPLIT=bool(split), NORMALISE=bool(normalise and top_k > 1), NATIVE=NATIVE,
            num_warps=4 if per * block_e >= 1024 else 1,
        )  # fmt: skip
    return weights, ids


@triton.jit
def _select_kernel(scores_ptr, visible_ptr, cand_ptr, made_ptr, order_ptr, ok_ptr, C, s_stride, c_stride, k,
                   BLOCK_C: tl.constexpr, TOP: tl.constexpr, CANDIDATES: tl.constexpr, MAKE: tl.constexpr,
                   GROUP: tl.constexpr, HAS_TOPK: tl.constexpr):  # fmt: skip
    """One row's top-k visible (and candidate) entries, stable descending; (0, False) past the real ones. MAKE:
    also its candidate mask, every GROUP-entry block that holds a real entry or is the newest."""
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK_C)
    inside = c < C
    s = tl.load(scores_ptr + row * s_stride + c, mask=inside, other=float("-inf"))
    visible = tl.load(visible_ptr + row)
    real = inside & (c < visible) & (s > float("-inf"))
    if MAKE:
        held = tl.max(tl.reshape(real.to(tl.int32), [BLOCK_C // GROUP, GROUP]), axis=1)
        held = tl.reshape(tl.broadcast_to(held[:, None], [BLOCK_C // GROUP, GROUP]), [BLOCK_C])
        newest = tl.where(visible > 0, (visible - 1) // GROUP, -1)
        tl.store(made_ptr + row * C + c, ((held != 0) | (c // GROUP == newest)).to(tl.uint8), mask=inside)
    if CANDIDATES:
        real = real & (tl.load(cand_ptr + row * c_stride + c, mask=inside, other=0) != 0)
    key = tl.where(real, _order_key(s, c), _INT64_MIN)
    if HAS_TOPK:
        top = tl.topk(key, TOP)
        pos = tl.arange(0, TOP)
    else:
        top = tl.sort(key, descending=True)
        pos = tl.arange(0, BLOCK_C)
    ok = top != _INT64_MIN
    at = row * k + pos
    tl.store(order_ptr + at, tl.where(ok, _key_column(top), 0).to(tl.int64), mask=pos < k)
    tl.store(ok_ptr + at, ok.to(tl.uint8), mask=pos < k)


def select(scores: torch.Tensor, visible: torch.Tensor, k: int, candidates: torch.Tensor | None,
           top_blocks: int, block: int, make_candidates: bool,
           config: PickConfig = PickConfig()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """(top-k entries [R, k] int64, which are real [R, k] bool, the candidate mask [R, C] bool or None) as
    compressed.select; rows wider than MAX_COLUMNS, and candidates the kernel cannot make, run its torch code."""
    if (make_candidates and not _makes(scores, top_blocks, block)) or scores.dim() != 2 \
            or scores.dtype != torch.float32 or scores.shape[1] > MAX_COLUMNS:  # fmt: skip
        from tfc.runtime.models.dsv41.fast.compressed import select as stage

        return stage.__wrapped__(scores, visible, k, candidates, top_blocks, block, make_candidates)
    rows, width = scores.shape
    bad = candidates is not None and candidates.shape != scores.shape
    if k < 1 or tuple(visible.shape) != (rows,) or bad:
        raise ValueError(
            f"select needs k >= 1, visible [R] and candidates [R, C] of scores {tuple(scores.shape)}"
        )
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    order = torch.empty(rows, k, dtype=torch.int64, device=scores.device)
    ok = torch.empty(rows, k, dtype=torch.bool, device=scores.device)
    made = torch.empty(rows, width, dtype=torch.bool, device=scores.device) if make_candidates else None
    if rows:
        top = triton.next_power_of_2(k)
        block_c = max(triton.next_power_of_2(max(width, 1)), top, block if make_candidates else 1)
        cand = scores if candidates is None or make_candidates else candidates.contiguous().view(torch.uint8)
        _select_kernel[(rows,)](
            scores, visible.contiguous(), cand, order if made is None else made.view(torch.uint8), order,
            ok.view(torch.uint8), width, scores.stride(0), cand.stride(0), k, BLOCK_C=block_c, TOP=top,
            CANDIDATES=candidates is not None and not make_candidates, MAKE=bool(make_candidates),
            GROUP=block if make_candidates else 1,
            HAS_TOPK=bool(HAS_TOPK), num_warps=max(1, min(16, block_c // config.select_columns_a_warp)),
        )  # fmt: skip
    return order, ok, made


def _makes(scores: torch.Tensor, top_blocks: int, block: int) -> bool:
    """Whether the kernel makes this candidate mask: every block kept (at most top_blocks of them), a block a
    power of two entries."""
    if block < 1 or block & (block - 1):
        return False
    return -(-scores.shape[-1] // block) <= top_blocks


__all__ = ["MAX_COLUMNS", "MAX_EXPERTS", "PickConfig", "pick", "select", "split3"]
