"""The cached rows' packing stages as plain Triton kernels (no torch.compile); the indexer's scores of packed keys
are kernels/dsv41/index_scores.py.

Drop-in replacements, same signatures, shapes and dtypes, of the `@fused` torch stages in
runtime/models/dsv41/fast/attention.py and compressed.py (byte formats: fast/kv_rows.py):

    window_rows(y, weight, eps, cos, sin)         pack_fp8(rope(rms_norm(y)))            uint8 [R, n + n/32]
    entry_rows(latent, cos, sin, grid)            pack_fp4(rope(latent), 16, e4m3)       uint8 [R, n/2 + n/16]
    key_rows(y, weight, eps, cos, sin, grid)      pack_fp4(rope(rms_norm(y)), 32, ue8m0) uint8 [R, n/2 + n/32]
    index_query(y, heads, cos, sin, grid)         fake_fp4(rope(y as heads), 32)         fp32 [R, heads, d]
    pooled(pending, slot, at, weight, eps)        rms_norm(sum_i kv_i * softmax(gate)_i) fp32 [R, n]

rope rotates the adjacent (even, odd) pairs of the trailing 2 * cos.shape[-1] channels (of each head). The
number formats are integer work on the bits (kernels/dsv41/stage_tl.py); a block scale divides where torch divides,
correctly rounded (div_rn), or multiplies by an exact power of two; an entry's e4m3 scale amax / 6 saturates
at 448 as torch's cast does. Every kernel is compiled without fused multiply-adds (enable_fp_fusion=False), so
each product and sum rounds as torch's eager ops do.

Against the torch stages in fp32:
  - bit for bit: entry_rows, index_query, and the packers given the same normalised rotated values. The rope
    is one rounded product per term and one rounded sum, as in torch. CUDA torch divides an entry's amax by 6 as a product by 1/6, so
    there (only) a rare entry scale may differ from these IEEE quotients.
  - window_rows, key_rows: rms_norm sums the squares in another order (its 1/sqrt correctly rounded, as
    torch's CPU rsqrt; CUDA's rsqrtf is approximate), so a normalised value may differ by an ulp, and a code
    flips to its neighbour where that value sits on a rounding boundary: none in 1.8 million bytes
    interpreted (the tests allow 1e-3 of the codes).
  - pooled: within a few ulp (2e-6 on outputs of order 1): exp and the sum of squares round differently.

Each program owns one row (and a block of its columns, heads or entries); its work runs in blocks fixed by the
trailing sizes, in a fixed order, with no atomics, so a row's bits never depend on R or on other rows.
Launches and torch.empty only: no host syncs, so the stages run inside a CUDA graph capture.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from tfc.kernels.dsv41.stage_tl import (
    e2m1_code,
    e2m1_value,
    e4m3_code,
    e4m3_value,
    pow2,
    pow2_ceil_exp,
    rotate,
)

__all__ = [
    "NO_FMA",
    "PackConfig",
    "entry_rows",
    "index_query",
    "key_rows",
    "pooled",
    "unit_stride",
    "window_rows",
]

MAX_ROW = 8192  # widest row a whole-row kernel (window_rows, key_rows) holds
MAX_POOL = 32768  # ring rows x channels (both rounded up to powers of two) a pooled program holds
NO_FMA = {"enable_fp_fusion": False}  # products and sums round as torch's eager ops
# kv_rows' constants (FP8_MAX = 448, FP4_MAX = 6), each rounded to fp32 where a kernel uses it, as torch does
_FP8_FLOOR = tl.constexpr(1e-4)  # the smallest amax a window row's block scale takes
_FP8_INV = tl.constexpr(1.0 / 448.0)
_FP4_FLOOR = tl.constexpr(6.0 * 2.0**-126)  # the smallest amax an index key's block scale takes
_FP4_INV = tl.constexpr(1.0 / 6.0)
_ENTRY_FLOOR = tl.constexpr(6.0 * 2.0**-9)  # the smallest amax an entry's e4m3 scale takes


@dataclass(frozen=True)
class PackConfig:
    """Launch values of the packs (any of them gives the same bits)."""

    tile: int = 512  # channels a program of entry_rows / index_query takes


@triton.jit
def _rms(ev, od, n, eps):
    """1 / sqrt(mean(x^2) + eps) of a row held as (even, odd) channels, square root and division rounded."""
    mean = tl.math.div_rn(tl.sum(ev * ev + od * od), n * 1.0)
    return tl.math.div_rn(1.0, tl.math.sqrt_rn(mean + eps))


@triton.jit
def _rope(ev, od, ch, cs, cos_ptr, sin_ptr, HEAD: tl.constexpr, HALF: tl.constexpr, live):
    """The pairs (ev, od) at even channels ch, rotated where ch % HEAD lies in a head's trailing 2 * HALF."""
    i = (ch % HEAD) // 2 - (HEAD // 2 - HALF)
    turn = live & (i >= 0)
    c = tl.load(cos_ptr + cs + i, mask=turn, other=1.0)
    s = tl.load(sin_ptr + cs + i, mask=turn, other=0.0)
    re, ro = rotate(ev, od, c, s)
    return tl.where(turn, re, ev), tl.where(turn, ro, od)


@triton.jit
def _rotated_pairs(row, ch, cs, cos_ptr, sin_ptr, HEAD: tl.constexpr, HALF: tl.constexpr, live):
    """The pairs at even channels ch of one row loaded from `row`, rotated as _rope."""
    ev = tl.load(row + ch, mask=live, other=0.0)
    od = tl.load(row + ch + 1, mask=live, other=0.0)
    return _rope(ev, od, ch, cs, cos_ptr, sin_ptr, HEAD, HALF, live)


@triton.jit
def _amax(ev, od):
    """The largest magnitude of each block (row) of a pair tile."""
    return tl.maximum(tl.max(tl.abs(ev), axis=1), tl.max(tl.abs(od), axis=1))


@triton.jit
def _ue8m0_exp(amax, floor, inv_max):
    """E of the block scale 2**E = pow2_ceil(max(amax, floor) * inv_max)."""
    return pow2_ceil_exp(tl.maximum(amax, floor) * inv_max)


@triton.jit
def _e4m3_byte(x):
    """The e4m3 byte (uint8) of x clamped to [-448, 448]."""
    return e4m3_code(tl.minimum(tl.maximum(x, -448.0), 448.0)).to(tl.uint8)


@triton.jit
def _fp4_ue8m0(ev, od):
    """(codes of the pairs as bytes, UE8M0 exponent E per block) of a [blocks, 16] pair tile, blocks of 32."""
    e = _ue8m0_exp(_amax(ev, od), _FP4_FLOOR, _FP4_INV)
    inv = pow2(-e)[:, None]
    lo = e2m1_code(tl.minimum(tl.maximum(ev * inv, -6.0), 6.0))
    hi = e2m1_code(tl.minimum(tl.maximum(od * inv, -6.0), 6.0))
    return lo | (hi << 4), e


@triton.jit
def _row_kernel(y_ptr, w_ptr, cos_ptr, sin_ptr, out_ptr, sy, scs, eps, N: tl.constexpr, HALF: tl.constexpr,
                NB: tl.constexpr, NORM: tl.constexpr, FP8: tl.constexpr):  # fmt: skip
    """One row: rms_norm (NORM), rope, then a UE8M0 scale per 32 channels and e4m3 (FP8) or e2m1 codes."""
    r = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, NB)
    ch = g[:, None] * 32 + 2 * tl.arange(0, 16)[None, :]
    live = ch < N
    row = y_ptr + r * sy
    ev = tl.load(row + ch, mask=live, other=0.0)
    od = tl.load(row + ch + 1, mask=live, other=0.0)
    if NORM:
        rstd = _rms(ev, od, N, eps)
        ev = tl.load(w_ptr + ch, mask=live, other=0.0).to(tl.float32) * (ev * rstd)
        od = tl.load(w_ptr + ch + 1, mask=live, other=0.0).to(tl.float32) * (od * rstd)
    ev, od = _rope(ev, od, ch, r * scs, cos_ptr, sin_ptr, N, HALF, live)
    if FP8:
        e = _ue8m0_exp(_amax(ev, od), _FP8_FLOOR, _FP8_INV)
        inv = pow2(-e)[:, None]
        out = out_ptr + r * (N + N // 32)
        tl.store(out + ch, _e4m3_byte(ev * inv), mask=live)
        tl.store(out + ch + 1, _e4m3_byte(od * inv), mask=live)
        tl.store(out + N + g, (e + 127).to(tl.uint8), mask=g < N // 32)
    else:
        codes, e = _fp4_ue8m0(ev, od)
        out = out_ptr + r * (N // 2 + N // 32)
        tl.store(out + ch // 2, codes.to(tl.uint8), mask=live)
        tl.store(out + N // 2 + g, (e + 127).to(tl.uint8), mask=g < N // 32)


@triton.jit
def _entry_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, sx, scs, N: tl.constexpr, HALF: tl.constexpr,
                  TB: tl.constexpr):  # fmt: skip
    """TB blocks of 16 channels of one row: rope, then e2m1 codes, an e4m3 scale per block (pack_fp4, 16)."""
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * TB + tl.arange(0, TB)
    ch = g[:, None] * 16 + 2 * tl.arange(0, 8)[None, :]
    live = ch < N
    ev, od = _rotated_pairs(x_ptr + r * sx, ch, r * scs, cos_ptr, sin_ptr, N, HALF, live)
    s8 = e4m3_code(tl.minimum(tl.math.div_rn(tl.maximum(_amax(ev, od), _ENTRY_FLOOR), 6.0), 448.0))
    scale = e4m3_value(s8)[:, None]
    lo = e2m1_code(tl.minimum(tl.maximum(tl.math.div_rn(ev, scale), -6.0), 6.0))
    hi = e2m1_code(tl.minimum(tl.maximum(tl.math.div_rn(od, scale), -6.0), 6.0))
    out = out_ptr + r * (N // 2 + N // 16)
    tl.store(out + ch // 2, (lo | (hi << 4)).to(tl.uint8), mask=live)
    tl.store(out + N // 2 + g, s8.to(tl.uint8), mask=g < N // 16)


@triton.jit
def _query_kernel(y_ptr, cos_ptr, sin_ptr, out_ptr, sy, scs, L: tl.constexpr, D: tl.constexpr,
                  HALF: tl.constexpr, TB: tl.constexpr):  # fmt: skip
    """TB blocks of 32 channels of one row of heads [L = heads * D]: rope per head, then fake FP4 (UE8M0)."""
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * TB + tl.arange(0, TB)
    ch = g[:, None] * 32 + 2 * tl.arange(0, 16)[None, :]
    live = ch < L
    ev, od = _rotated_pairs(y_ptr + r * sy, ch, r * scs, cos_ptr, sin_ptr, D, HALF, live)
    codes, e = _fp4_ue8m0(ev, od)
    scale = pow2(e)[:, None]
    out = out_ptr + r * L
    tl.store(out + ch, e2m1_value(codes & 15) * scale, mask=live)
    tl.store(out + ch + 1, e2m1_value(codes >> 4) * scale, mask=live)


@triton.jit
def _pooled_kernel(p_ptr, slot_ptr, at_ptr, w_ptr, out_ptr, G, N, ssr, sar, sac, sp0, sp1, sp2, eps,
                   GB: tl.constexpr, NB: tl.constexpr):  # fmt: skip
    """One row: the softmax(gate)-weighted sum of its G ring rows' kv, then rms_norm."""
    r = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, GB)
    c = tl.arange(0, NB)
    used, inside = i < G, c < N
    slot = tl.load(slot_ptr + r * ssr)
    at = tl.load(at_ptr + r * sar + i * sac, mask=used, other=0)
    off = (slot * sp1 + at * sp2)[:, None] + c[None, :]
    keep = used[:, None] & inside[None, :]
    kv = tl.load(p_ptr + off, mask=keep, other=0.0)
    gate = tl.where(used[:, None], tl.load(p_ptr + sp0 + off, mask=keep, other=0.0), float("-inf"))
    e = tl.exp(gate - tl.max(gate, axis=0)[None, :])
    x = tl.sum(kv * tl.math.div_rn(e, tl.sum(e, axis=0)[None, :]), axis=0)
    mean = tl.math.div_rn(tl.sum(x * x), N * 1.0)
    rstd = tl.math.div_rn(1.0, tl.math.sqrt_rn(mean + eps))
    w = tl.load(w_ptr + c, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * N + c, w * (x * rstd), mask=inside)


def _pow2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << max(0, (n - 1).bit_length())


def unit_stride(t: torch.Tensor) -> torch.Tensor:
    """t with a unit stride in its last dimension (a copy only where it has none)."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _rows(name: str, x: torch.Tensor, block: int) -> None:
    """Raise unless x is fp32 [R, n] with n a multiple of block."""
    if x.dim() != 2 or x.dtype != torch.float32 or x.shape[1] % block:
        raise ValueError(f"{name} must be fp32 [R, n], n % {block} == 0; got {x.dtype} {tuple(x.shape)}")


def _rope_tables(cos: torch.Tensor, sin: torch.Tensor, rows: int, width: int) -> tuple[torch.Tensor, ...]:
    """cos / sin [R, half] fp32 with 2 * half <= width, unit-strided."""
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[0] != rows or 2 * cos.shape[1] > width:
        raise ValueError(f"cos, sin {tuple(cos.shape)}, {tuple(sin.shape)} must be [{rows}, <= {width // 2}]")
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError(f"cos / sin must be fp32; got {cos.dtype} / {sin.dtype}")
    cos, sin = unit_stride(cos), unit_stride(sin)
    if cos.stride(0) != sin.stride(0):
        cos, sin = cos.contiguous(), sin.contiguous()
    return cos, sin


def _pack_rows(y, weight, eps, cos, sin, fp8: bool, norm: bool = True) -> torch.Tensor:
    """window_rows (fp8) or key_rows of y [R, n]; without `norm`, the pack of rope(y) alone (for tests)."""
    name = "window_rows y" if fp8 else "key_rows y"
    _rows(name, y, 32)
    rows, n = y.shape
    if n > MAX_ROW or weight.shape != (n,):
        raise ValueError(f"{name}: n = {n} (at most {MAX_ROW}) needs weight [{n}]; got {tuple(weight.shape)}")
    y, weight = unit_stride(y), weight.contiguous()
    cos, sin = _rope_tables(cos, sin, rows, n)
    out = torch.empty((rows, n + n // 32 if fp8 else n // 2 + n // 32), dtype=torch.uint8, device=y.device)
    if rows:
        nb = _pow2(n // 32)
        _row_kernel[(rows,)](y, weight, cos, sin, out, y.stride(0), cos.stride(0), eps, N=n,
                             HALF=cos.shape[1], NB=nb, NORM=norm, FP8=fp8, num_warps=4 if nb >= 8 else 1,
                             **NO_FMA)  # fmt: skip
    return out


def window_rows(
    y: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """The FP8 window rows uint8 [R, n + n/32] of the K=V latents y [R, n]: pack_fp8(rope(rms_norm(y)))."""
    return _pack_rows(y, weight, eps, cos, sin, True)


def key_rows(
    y: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, grid
) -> torch.Tensor:
    """The FP4 indexer key rows uint8 [R, n/2 + n/32] of y [R, n]: pack_fp4(rope(rms_norm(y)), 32, UE8M0)."""
    return _pack_rows(y, weight, eps, cos, sin, False)


def entry_rows(latent: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, grid,
               config: PackConfig = PackConfig()) -> torch.Tensor:  # fmt: skip
    """The FP4 entry rows uint8 [R, n/2 + n/16] of latents [R, n]: pack_fp4(rope(latent), 16, e4m3)."""
    _rows("entry_rows latent", latent, 16)
    rows, n = latent.shape
    x = unit_stride(latent)
    cos, sin = _rope_tables(cos, sin, rows, n)
    out = torch.empty((rows, n // 2 + n // 16), dtype=torch.uint8, device=x.device)
    tb = min(_pow2(n // 16), config.tile // 16)
    if rows:
        _entry_kernel[(rows, triton.cdiv(n // 16, tb))](
            x, cos, sin, out, x.stride(0), cos.stride(0), N=n, HALF=cos.shape[1], TB=tb, num_warps=4, **NO_FMA
        )
    return out


def index_query(y: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, grid,
                config: PackConfig = PackConfig()) -> torch.Tensor:  # fmt: skip
    """The indexer's FP4 queries fp32 [R, heads, d] of y [R, heads * d]: fake_fp4(rope(y as heads), 32)."""
    _rows("index_query y", y, 32)
    rows, width = y.shape
    if heads < 1 or width % heads or (width // heads) % 32:
        raise ValueError(f"index_query: {width} channels do not split into {heads} heads of a multiple of 32")
    d = width // heads
    y = unit_stride(y)
    cos, sin = _rope_tables(cos, sin, rows, d)
    out = torch.empty((rows, heads, d), dtype=torch.float32, device=y.device)
    tb = min(_pow2(width // 32), config.tile // 32)
    if rows:
        launch = (rows, triton.cdiv(width // 32, tb))
        _query_kernel[launch](y, cos, sin, out, y.stride(0), cos.stride(0), L=width, D=d, HALF=cos.shape[1],
                              TB=tb, num_warps=4, **NO_FMA)  # fmt: skip
    return out


def pooled(
    pending: torch.Tensor, slot: torch.Tensor, at: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """The normalised latents fp32 [R, n] of the groups at ring rows at [R, r] of pending [2, S, ring, n]."""
    if pending.dim() != 4 or pending.shape[0] != 2 or pending.dtype != torch.float32:
        raise ValueError(f"pooled pending must be fp32 [2, slots, ring, n]; got {tuple(pending.shape)}")
    n = pending.shape[3]
    if at.dim() != 2 or slot.shape != (at.shape[0], 1) or weight.shape != (n,):
        raise ValueError(
            f"pooled slot {tuple(slot.shape)}, at {tuple(at.shape)}, weight {tuple(weight.shape)} disagree"
        )
    rows, group = at.shape
    if group < 1 or _pow2(group) * _pow2(n) > MAX_POOL:
        raise ValueError(f"pooled: {group} ring rows of {n} channels exceed {MAX_POOL} values a program")
    pending, weight = unit_stride(pending), weight.contiguous()
    out = torch.empty((rows, n), dtype=torch.float32, device=pending.device)
    if rows:
        p0, p1, p2, _ = pending.stride()
        _pooled_kernel[(rows,)](pending, slot, at, weight, out, group, n, slot.stride(0), at.stride(0),
                                at.stride(1), p0, p1, p2, eps, GB=_pow2(group), NB=_pow2(n), num_warps=4,
                                **NO_FMA)  # fmt: skip
    return out
