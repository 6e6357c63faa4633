"""The fast forward's small fp32 stages as plain Triton kernels: a restart needs no torch.compile.

Drop-in replacements, same signatures and fp32 results, of the `@fused` torch stages
(runtime/models/dsv41/fast/fp32.py, engram.py, attention.py):

    rms_norm(x, weight, eps)                     weight * x * rsqrt(mean(x^2) + eps) over the last axis
    collapse_norm(streams, pre, weight, eps)     rms_norm(sum_i pre_i * stream_i): a site's input
    hc_expand(y, residual, post, comb)           new streams: post_k * y + sum_j comb[j, k] * residual_j
    hc_mix_logits(streams, fn, scale, base, ...) the mHC mix before its Sinkhorn: (pre, post, comb logits)
    engram_gate(streams, kv, qk, eps, clamp)     streams + sigmoid(signed sqrt of the scaled dot) * value
    rope_heads(y, heads, cos, sin)               rows as heads, their trailing rope slice rotated

Every kernel grids over rows (and column blocks or heads where a row is wide); a row's reductions run inside
one program over blocks fixed by the trailing sizes, in a fixed order, with no atomics, so a row's bits do not
depend on R or on the other rows, and a rerun gives the same bits. Launches and torch.empty only: no host
syncs, so they run inside a CUDA graph capture. Activations must be fp32; weights (norm weights, fn, qk,
scale, base) may be fp32, bf16 or fp16 and are widened in registers. Every reduction is fp32.

hc_mix_logits applies the norm's rsqrt after the product: mixes = (flat @ fn.T) * rstd, where torch
scales flat first. The product is full fp32 (input_precision="ieee", never TF32): each program multiplies a
fixed KC-wide slice of K = hc * D (S = ceil(K / KC) slices, fixed by D) for BR rows and writes its partial
products [R, S, M] and sums of squares [R, S]; a second kernel adds the S partials of a row in a fixed tree
and applies the sigmoid / scale / base epilogue.

Tolerances against the torch stages in fp32 (and float64): fp32 sums in another order (and fused
multiply-adds on a GPU), so ~1e-6 relative on normalised rows, mixes and gates (a few ulp of the row's scale
per element); rope_heads and the nope channels it copies are exact under the interpreter (within an ulp on a
GPU, where a multiply-add may fuse).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from tfc.kernels.dsv41.stage_tl import rotate

MAX_ROW = 16384  # widest row a whole-row kernel holds (one program a row)


@dataclass(frozen=True)
class StageConfig:
    """Launch values of the small stages (mix_split and mix_step set the mix product's summation order; the
    others change no bit)."""

    mix_rows: int = 32  # rows a program of the mix product takes (BR)
    mix_split: int = 128  # K = hc * D a program of the mix product takes (KC)
    mix_step: int = 32  # K per tl.dot of the mix product (BK)
    expand_block: int = 512  # columns a program of hc_expand takes
    rope_tile: int = 2048  # channels a program of rope_heads takes (heads a program: rope_tile // d, >= 1)


@triton.jit
def _rstd(ssq, n, eps):
    """1 / sqrt(ssq / n + eps), the square root and division correctly rounded."""
    return tl.div_rn(1.0, tl.sqrt_rn(ssq / n + eps))


@triton.jit
def _sigmoid(z):
    """1 / (1 + exp(-z))."""
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, N, eps, BLOCK: tl.constexpr):
    """out[r] = w * (x[r] * rstd(x[r])) for the row r of this program."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    inside = c < N
    x = tl.load(x_ptr + r * N + c, mask=inside, other=0.0)
    w = tl.load(w_ptr + c, mask=inside, other=0.0).to(tl.float32)
    rstd = _rstd(tl.sum(x * x, axis=0), N, eps)
    tl.store(out_ptr + r * N + c, w * (x * rstd), mask=inside)


@triton.jit
def _collapse_norm_kernel(s_ptr, pre_ptr, w_ptr, out_ptr, D, eps, HC: tl.constexpr, BLOCK: tl.constexpr):
    """out[r] = rms_norm(sum_i pre[r, i] * streams[r, i]) for the row r of this program (i in order)."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, BLOCK)
    inside = c < D
    row = s_ptr + r * HC * D
    acc = tl.load(pre_ptr + r * HC) * tl.load(row + c, mask=inside, other=0.0)
    for i in tl.static_range(1, HC):
        acc += tl.load(pre_ptr + r * HC + i) * tl.load(row + i * D + c, mask=inside, other=0.0)
    w = tl.load(w_ptr + c, mask=inside, other=0.0).to(tl.float32)
    rstd = _rstd(tl.sum(acc * acc, axis=0), D, eps)
    tl.store(out_ptr + r * D + c, w * (acc * rstd), mask=inside)


@triton.jit
def _hc_expand_kernel(y_ptr, res_ptr, post_ptr, comb_ptr, out_ptr, D, HC: tl.constexpr, HB: tl.constexpr,
                      BLOCK: tl.constexpr):  # fmt: skip
    """out[r, k, cols] = post[r, k] * y[r, cols] + sum_j comb[r, j, k] * residual[r, j, cols] (j in order)."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    k = tl.arange(0, HB)
    inside, live = c < D, k < HC
    res = res_ptr + r * HC * D
    mixed = tl.zeros((HB, BLOCK), tl.float32)
    for j in tl.static_range(HC):
        cj = tl.load(comb_ptr + r * HC * HC + j * HC + k, mask=live, other=0.0)
        mixed += cj[:, None] * tl.load(res + j * D + c, mask=inside, other=0.0)[None, :]
    y = tl.load(y_ptr + r * D + c, mask=inside, other=0.0)
    post = tl.load(post_ptr + r * HC + k, mask=live, other=0.0)
    out = post[:, None] * y[None, :] + mixed
    tl.store(out_ptr + r * HC * D + k[:, None] * D + c[None, :], out, mask=live[:, None] & inside[None, :])


@triton.jit
def _mix_partial_kernel(x_ptr, fn_ptr, part_ptr, sq_ptr, R, K, M: tl.constexpr, MB: tl.constexpr, S: tl.constexpr,
                        KC: tl.constexpr, BR: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """part[rows, s] = x[rows, slice s] @ fn[:, slice s].T and sq[rows, s] = sum x[rows, slice s]^2 (fp32)."""
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    s = tl.program_id(1)
    m = tl.arange(0, MB)
    live, used = rows < R, m < M
    x_row = x_ptr + rows.to(tl.int64)[:, None] * K
    acc = tl.zeros((BR, MB), tl.float32)
    sq = tl.zeros((BR, BK), tl.float32)
    for k0 in range(0, KC, BK):
        k = s * KC + k0 + tl.arange(0, BK)
        inside = k < K
        x = tl.load(x_row + k[None, :], mask=live[:, None] & inside[None, :], other=0.0)
        w = tl.load(fn_ptr + m[None, :] * K + k[:, None], mask=inside[:, None] & used[None, :], other=0.0)
        acc = tl.dot(x, w.to(tl.float32), acc, input_precision="ieee")
        sq += x * x
    at = rows.to(tl.int64) * S + s
    tl.store(part_ptr + at[:, None] * M + m[None, :], acc, mask=live[:, None] & used[None, :])
    tl.store(sq_ptr + at, tl.sum(sq, axis=1), mask=live)


@triton.jit
def _mix_epilogue_kernel(part_ptr, sq_ptr, scale_ptr, base_ptr, pre_ptr, post_ptr, logit_ptr, K, norm_eps, hc_eps,
                         post_alpha, HC: tl.constexpr, M: tl.constexpr, MB: tl.constexpr, S: tl.constexpr,
                         SB: tl.constexpr):  # fmt: skip
    """One row's mixes (its S partials summed, times the norm's rstd), then pre, post and the comb logits."""
    r = tl.program_id(0).to(tl.int64)
    s = tl.arange(0, SB)
    m = tl.arange(0, MB)
    used = m < M
    part = tl.load(
        part_ptr + (r * S + s[:, None]) * M + m[None, :], mask=(s < S)[:, None] & used[None, :], other=0.0
    )
    ssq = tl.sum(tl.load(sq_ptr + r * S + s, mask=s < S, other=0.0), axis=0)
    mixes = tl.sum(part, axis=0) * _rstd(ssq, K, norm_eps)
    scale = tl.load(scale_ptr + tl.minimum(m // HC, 2), mask=used, other=0.0).to(tl.float32)
    z = mixes * scale + tl.load(base_ptr + m, mask=used, other=0.0).to(tl.float32)
    sig = _sigmoid(z)
    is_pre, is_post, is_comb = m < HC, (m >= HC) & (m < 2 * HC), (m >= 2 * HC) & used
    tl.store(pre_ptr + r * HC + tl.where(is_pre, m, 0), sig + hc_eps, mask=is_pre)
    tl.store(post_ptr + r * HC + tl.where(is_post, m - HC, 0), post_alpha * sig, mask=is_post)
    tl.store(logit_ptr + r * (HC * HC) + tl.where(is_comb, m - 2 * HC, 0), z, mask=is_comb)


@triton.jit
def _engram_gate_kernel(s_ptr, kv_ptr, qk_ptr, out_ptr, D, eps, clamp, inv_sqrt_d, HC: tl.constexpr,
                        BLOCK: tl.constexpr):  # fmt: skip
    """out[r, i] = streams[r, i] + gate[r, i] * value[r] for the row r and stream i of this program."""
    r = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1)
    c = tl.arange(0, BLOCK)
    inside = c < D
    at = (r * HC + i) * D + c
    kv = kv_ptr + r * (HC + 1) * D
    s = tl.load(s_ptr + at, mask=inside, other=0.0)
    key = tl.load(kv + i * D + c, mask=inside, other=0.0)
    qk = tl.load(qk_ptr + i * D + c, mask=inside, other=0.0).to(tl.float32)
    rstd = _rstd(tl.sum(s * s, axis=0), D, eps) * _rstd(tl.sum(key * key, axis=0), D, eps)
    dot = tl.sum(s * qk * key, axis=0) * rstd * inv_sqrt_d
    root = tl.sqrt_rn(tl.maximum(tl.abs(dot), clamp))
    gate = _sigmoid(tl.where(dot.to(tl.int32, bitcast=True) < 0, -root, root))  # copysign: -0.0 counts
    value = tl.load(kv + HC * D + c, mask=inside, other=0.0)
    tl.store(out_ptr + at, s + gate * value, mask=inside)


@triton.jit
def _rope_heads_kernel(y_ptr, cos_ptr, sin_ptr, out_ptr, HEADS, D: tl.constexpr, HALF: tl.constexpr,
                       NOPE: tl.constexpr, HB: tl.constexpr, NB: tl.constexpr, PB: tl.constexpr):  # fmt: skip
    """HB heads of row r: the first NOPE = D - 2 * HALF channels copied, the (even, odd) pairs after them rotated."""
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * HB + tl.arange(0, HB)
    live = h < HEADS
    head = r * HEADS * D + h.to(tl.int64)[:, None] * D
    if NOPE > 0:
        c = tl.arange(0, NB)
        keep = live[:, None] & (c < NOPE)[None, :]
        tl.store(out_ptr + head + c[None, :], tl.load(y_ptr + head + c[None, :], mask=keep), mask=keep)
    j = tl.arange(0, PB)
    pair = j < HALF
    cos = tl.load(cos_ptr + r * HALF + j, mask=pair, other=0.0)[None, :]
    sin = tl.load(sin_ptr + r * HALF + j, mask=pair, other=0.0)[None, :]
    even_at = head + NOPE + 2 * j[None, :]
    keep = live[:, None] & pair[None, :]
    even, odd = rotate(tl.load(y_ptr + even_at, mask=keep), tl.load(y_ptr + even_at + 1, mask=keep), cos, sin)
    tl.store(out_ptr + even_at, even, mask=keep)
    tl.store(out_ptr + even_at + 1, odd, mask=keep)


def _pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def _warps(block: int) -> int:
    """Warps for a whole-row block of `block` fp32 values (16 a thread at most)."""
    return min(16, max(1, block // 512))


def _fp32(name: str, t: torch.Tensor) -> None:
    """Refuse an activation that is not fp32."""
    if t.dtype != torch.float32:
        raise ValueError(f"{name} must be float32, got {t.dtype}")


def _row_block(name: str, n: int) -> int:
    """The power-of-two block that holds a row of n values, or a ValueError where none may."""
    if not 1 <= n <= MAX_ROW:
        raise ValueError(f"{name} rows of {n} values: 1 to {MAX_ROW} supported")
    return _pow2(n)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last axis of fp32 x [..., n] (weight [n], any float dtype)."""
    _fp32("x", x)
    n = x.shape[-1]
    block = _row_block("rms_norm", n)
    if tuple(weight.shape) != (n,):
        raise ValueError(f"weight {tuple(weight.shape)} does not fit rows of {n}")
    rows = x.reshape(-1, n).contiguous()
    out = torch.empty(rows.shape, dtype=torch.float32, device=x.device)
    if rows.shape[0]:
        _rms_norm_kernel[(rows.shape[0],)](rows, weight.contiguous(), out, n, eps, BLOCK=block,
                                           num_warps=_warps(block))  # fmt: skip
    return out.view(x.shape)


def collapse_norm(streams: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(sum_i pre_i * stream_i) [..., D] of fp32 streams [..., hc, D] and pre [..., hc]: a site's input."""
    _fp32("streams", streams)
    _fp32("pre", pre)
    hc, d = streams.shape[-2:]
    block = _row_block("collapse_norm", d)
    if tuple(pre.shape) != tuple(streams.shape[:-1]) or tuple(weight.shape) != (d,):
        raise ValueError(
            f"pre {tuple(pre.shape)} / weight {tuple(weight.shape)} do not fit streams {tuple(streams.shape)}"
        )
    s = streams.reshape(-1, hc, d).contiguous()
    out = torch.empty((s.shape[0], d), dtype=torch.float32, device=streams.device)
    if s.shape[0]:
        _collapse_norm_kernel[(s.shape[0],)](s, pre.reshape(-1, hc).contiguous(), weight.contiguous(), out, d, eps,
                                             HC=hc, BLOCK=block, num_warps=_warps(block))  # fmt: skip
    return out.view(*streams.shape[:-2], d)


def hc_expand(
    y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
    config: StageConfig = StageConfig(),
) -> torch.Tensor:  # fmt: skip
    """New streams [..., hc, D]: post_k * y + sum_j comb[j, k] * residual_j, all fp32."""
    for name, t in (("y", y), ("residual", residual), ("post", post), ("comb", comb)):
        _fp32(name, t)
    hc, d = residual.shape[-2:]
    lead = tuple(residual.shape[:-2])
    if (
        tuple(y.shape) != (*lead, d)
        or tuple(post.shape) != (*lead, hc)
        or tuple(comb.shape) != (*lead, hc, hc)
    ):
        raise ValueError(f"y {tuple(y.shape)}, post {tuple(post.shape)}, comb {tuple(comb.shape)} do not fit "
                         f"residual {tuple(residual.shape)}")  # fmt: skip
    if d < 1 or hc < 1:
        raise ValueError(f"residual {tuple(residual.shape)} has no streams to expand")
    res = residual.reshape(-1, hc, d).contiguous()
    rows = res.shape[0]
    out = torch.empty((rows, hc, d), dtype=torch.float32, device=residual.device)
    block = min(config.expand_block, _pow2(d))
    if rows:
        _hc_expand_kernel[(rows, triton.cdiv(d, block))](
            y.reshape(-1, d).contiguous(), res, post.reshape(-1, hc).contiguous(),
            comb.reshape(-1, hc, hc).contiguous(), out, d, HC=hc, HB=_pow2(hc), BLOCK=block, num_warps=4,
        )  # fmt: skip
    return out.view(residual.shape)


def hc_mix_logits(streams: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *,
                  norm_eps: float, hc_eps: float, post_alpha: float = 2.0, config: StageConfig = StageConfig()
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(pre [..., hc], post [..., hc], comb logits [..., hc, hc]) of fp32 streams [..., hc, D] and fn
    [(2 + hc) * hc, hc * D]; the norm's rsqrt scales the product, (flat @ fn.T) * rstd."""
    _fp32("streams", streams)
    hc, d = streams.shape[-2:]
    m, k = (2 + hc) * hc, hc * d
    if hc < 1 or d < 1 or (tuple(fn.shape), tuple(base.shape), tuple(scale.shape)) != ((m, k), (m,), (3,)):
        raise ValueError(f"fn {tuple(fn.shape)}, base {tuple(base.shape)}, scale {tuple(scale.shape)} do not fit "
                         f"streams {tuple(streams.shape)}: want fn [{m}, {k}], base [{m}], scale [3]")  # fmt: skip
    if m > 64:
        raise ValueError(f"hc {hc} gives {m} mixes: 64 at most supported")
    x = streams.reshape(-1, k).contiguous()
    rows, dev = x.shape[0], streams.device
    splits = triton.cdiv(k, config.mix_split)
    pre = torch.empty((rows, hc), dtype=torch.float32, device=dev)
    post = torch.empty((rows, hc), dtype=torch.float32, device=dev)
    logits = torch.empty((rows, hc, hc), dtype=torch.float32, device=dev)
    if rows:
        part = torch.empty((rows, splits, m), dtype=torch.float32, device=dev)
        sq = torch.empty((rows, splits), dtype=torch.float32, device=dev)
        mb = max(16, _pow2(m))
        _mix_partial_kernel[(triton.cdiv(rows, config.mix_rows), splits)](
            x, fn.contiguous(), part, sq, rows, k, M=m, MB=mb, S=splits, KC=config.mix_split, BR=config.mix_rows,
            BK=config.mix_step, num_warps=4,
        )  # fmt: skip
        _mix_epilogue_kernel[(rows,)](
            part, sq, scale.contiguous(), base.contiguous(), pre, post, logits, k, norm_eps, hc_eps, post_alpha,
            HC=hc, M=m, MB=mb, S=splits, SB=_pow2(splits), num_warps=4,
        )  # fmt: skip
    lead = tuple(streams.shape[:-2])
    return pre.view(*lead, hc), post.view(*lead, hc), logits.view(*lead, hc, hc)


def engram_gate(
    streams: torch.Tensor, kv: torch.Tensor, qk: torch.Tensor, eps: float, clamp: float
) -> torch.Tensor:
    """Streams [R, hc, D] plus each one's gated share of the value, from fp32 kv [R, (hc + 1) * D] and qk [hc, D]."""
    _fp32("streams", streams)
    _fp32("kv", kv)
    if streams.dim() != 3:
        raise ValueError(f"streams {tuple(streams.shape)} must be [R, hc, D]")
    r, hc, d = streams.shape
    block = _row_block("engram_gate", d)
    if tuple(kv.shape) != (r, (hc + 1) * d) or tuple(qk.shape) != (hc, d):
        raise ValueError(
            f"kv {tuple(kv.shape)} / qk {tuple(qk.shape)} do not fit streams {tuple(streams.shape)}"
        )
    s = streams.contiguous()
    out = torch.empty((r, hc, d), dtype=torch.float32, device=streams.device)
    if r and hc:
        _engram_gate_kernel[(r, hc)](s, kv.contiguous(), qk.contiguous(), out, d, eps, clamp, d**-0.5, HC=hc,
                                     BLOCK=block, num_warps=_warps(block))  # fmt: skip
    return out


def rope_heads(y: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor,
               config: StageConfig = StageConfig()) -> torch.Tensor:  # fmt: skip
    """fp32 rows [R, heads * d] as heads [R, heads, d], the trailing 2 * cos.shape[-1] channels rotated by
    cos / sin [R, rope_dim / 2] in adjacent (even, odd) pairs, the rest copied."""
    for name, t in (("y", y), ("cos", cos), ("sin", sin)):
        _fp32(name, t)
    if y.dim() != 2 or heads < 1 or y.shape[1] % heads:
        raise ValueError(f"y {tuple(y.shape)} is not rows of {heads} heads")
    r, d = y.shape[0], y.shape[1] // heads
    half = cos.shape[-1]
    if cos.dim() != 2 or tuple(cos.shape) != tuple(sin.shape) or cos.shape[0] != r or not 1 <= 2 * half <= d:
        raise ValueError(
            f"cos {tuple(cos.shape)} / sin {tuple(sin.shape)} do not fit {r} rows of heads of {d}"
        )
    if d > MAX_ROW:
        raise ValueError(f"heads of {d} channels: {MAX_ROW} at most supported")
    out = torch.empty((r, heads, d), dtype=torch.float32, device=y.device)
    hb = max(1, config.rope_tile // _pow2(d))
    if r:
        _rope_heads_kernel[(r, triton.cdiv(heads, hb))](
            y.contiguous(), cos.contiguous(), sin.contiguous(), out, heads, D=d, HALF=half,
            NOPE=d - 2 * half, HB=hb, NB=_pow2(max(1, d - 2 * half)), PB=_pow2(half), num_warps=4,
        )  # fmt: skip
    return out


__all__ = [
    "StageConfig",
    "collapse_norm",
    "engram_gate",
    "hc_expand",
    "hc_mix_logits",
    "rms_norm",
    "rope_heads",
]
