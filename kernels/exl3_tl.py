"""Triton building blocks shared by the EXL3 kernels: tile window offsets, state extraction, codebooks, H128."""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def tile_positions(BK: tl.constexpr, BN: tl.constexpr):
    """Stream position i of each element of a [BK, BN] block made of whole 16x16 tiles (spec §5)."""
    r = tl.arange(0, BK) % 16
    c = tl.arange(0, BN) % 16
    # i = 8 t + p with t = 4 (c & 7) + ((r >> 1) & 3) and p = 4 (c >> 3) + 2 (r >> 3) + (r & 1).
    col = 32 * (c & 7) + 4 * (c >> 3)
    row = 8 * ((r >> 1) & 3) + 2 * (r >> 3) + (r & 1)
    return row[:, None] + col[None, :]


@triton.jit
def window_offsets(pos, width, tn, BK: tl.constexpr, BN: tl.constexpr):
    """Word offsets (j, jp) of each element's 16-bit window inside its block, and the right shift.

    `pos` = tile_positions; `width` = int16 words per tile (constexpr or runtime); `tn` = tiles per k-row.
    Offsets are relative to the block's first tile, whose tiles sit at k-stride tn tiles.
    """
    nw = width // 2
    e1 = ((pos + 1) * width >> 4) - 1  # last ring bit of the window (spec §3.1/§3.2)
    j = e1 >> 5
    jp = tl.where(j == 0, nw - 1, j - 1)
    shift = 31 - (e1 & 31)
    kt = tl.arange(0, BK) // 16
    nt = tl.arange(0, BN) // 16
    tile = (kt[:, None] * tn + nt[None, :]) * nw
    return tile + j, tile + jp, shift


@triton.jit
def load_states(base, off_j, off_jp, shift):
    """16-bit states: ((w[jp] << 32 | w[j]) >> shift) & 0xFFFF, w = the tile's little-endian uint32 words."""
    lo = tl.load(base + off_j).to(tl.uint32, bitcast=True).to(tl.uint64)
    hi = tl.load(base + off_jp).to(tl.uint32, bitcast=True).to(tl.uint64)
    return (((hi << 32) | lo) >> shift.to(tl.uint64)).to(tl.uint32) & 0xFFFF


@triton.jit
def cb_mul1(s):
    """MUL1: (1024 + bytesum(s * 0x83DCD12D)) * k_inv + k_bias, exact in fp32, one rounding to fp16."""
    x = s * 0x83DCD12D
    pairs = (x & 0x00FF00FF) + ((x >> 8) & 0x00FF00FF)
    b = (pairs & 0xFFFF) + (pairs >> 16)
    # fp32 bits of 1024 + b (b < 1024) without an int->float conversion.
    h = (0x44800000 + (b << 13)).to(tl.float32, bitcast=True)
    return (h * 0.0067672729492187500 - 10.3828125).to(tl.float16)


@triton.jit
def cb_inst(s, mult, add):
    """3INST (mult 89226354, add 64248484) / MCG (mult 0xCBAC1FED, add 0): LOP3 then sum of fp16 halves."""
    x = s * mult + add
    x = (x & 0x8FFF8FFF) ^ 0x3B603B60
    lo = (x & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True)
    hi = (x >> 16).to(tl.uint16).to(tl.float16, bitcast=True)
    # The halves are in ±[0.125, 2): the fp32 sum is exact, so a single fp16 rounding equals __hadd.
    return (lo.to(tl.float32) + hi.to(tl.float32)).to(tl.float16)


@triton.jit
def cb_decode(s, CB: tl.constexpr):
    """Codebook CB (0 3inst, 1 mcg, 2 mul1) of uint32 states -> fp16."""
    if CB == 2:
        v = cb_mul1(s)
    elif CB == 1:
        v = cb_inst(s, 0xCBAC1FED, 0)
    else:
        v = cb_inst(s, 89226354, 64248484)
    return v


@triton.jit
def cb_decode_rt(s, cb):
    """Codebook chosen at run time (per expert-table entry)."""
    if cb == 2:
        v = cb_mul1(s)
    elif cb == 1:
        v = cb_inst(s, 0xCBAC1FED, 0)
    else:
        v = cb_inst(s, 89226354, 64248484)
    return v


@triton.jit
def parity7(v):
    """Parity of the low 7 bits."""
    v = v ^ (v >> 4)
    v = v ^ (v >> 2)
    v = v ^ (v >> 1)
    return v & 1


@triton.jit
def hadamard_block(R: tl.constexpr, C: tl.constexpr, row0, col0):
    """Unnormalized H128[row0 + i, col0 + j] (±1.0 fp32) for an [R, C] window."""
    i = row0 + tl.arange(0, R)
    j = col0 + tl.arange(0, C)
    return 1.0 - 2.0 * parity7(i[:, None] & j[None, :]).to(tl.float32)


@triton.jit
def rotate_rows(a, MP: tl.constexpr):
    """a [MP, 128] fp32 -> a @ H128 / sqrt(128), in fp32 (tf32x3 matrix units when MP >= 16)."""
    h = hadamard_block(128, 128, 0, 0)
    if MP >= 16:
        out = tl.dot(a, h, input_precision="tf32x3")
    else:
        out = tl.sum(a[:, :, None] * h[None, :, :], axis=1)
    return out * 0.08838834764831845


@triton.jit
def rotated_slice(x_ptr, suh_ptr, M, stride_x, row0, MP: tl.constexpr, BK: tl.constexpr):
    """xh[:, row0:row0+BK] computed from x: rows of H128 times the sign of (i & j0) (j0 = row0 mod 128)."""
    blk0 = (row0 // 128) * 128
    j0 = row0 - blk0
    i = tl.arange(0, 128)
    m = tl.arange(0, MP)
    x = tl.load(x_ptr + m[:, None] * stride_x + (blk0 + i)[None, :], mask=m[:, None] < M, other=0.0)
    sign = 1.0 - 2.0 * parity7(i & j0).to(tl.float32)
    a = x.to(tl.float32) * (tl.load(suh_ptr + blk0 + i).to(tl.float32) * sign * 0.08838834764831845)[None, :]
    h = hadamard_block(128, BK, 0, 0)
    if MP >= 16:
        out = tl.dot(a, h, input_precision="tf32x3")
    else:
        out = tl.sum(a[:, :, None] * h[None, :, :], axis=1)
    return out


def next_pow2(v: int) -> int:
    """Smallest power of two >= v."""
    return triton.next_power_of_2(v)
