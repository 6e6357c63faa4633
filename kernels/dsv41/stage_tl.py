"""Triton device functions the fast forward's stage kernels share: the cached rows' number formats by bits.

Every function works on fp32 / int32 tensors inside a kernel and gives the bits torch gives in
runtime/models/dsv41/fast/kv/rows.py, on a GPU and under TRITON_INTERPRET=1 alike: the e4m3 encoding is
done with integer operations (round to nearest even), because the interpreter's float8 casts do not round
as CUDA and torch do.

    e4m3_code(x)        fp32 (finite, |x| <= 448) -> its float8_e4m3fn byte, as torch's .to(float8_e4m3fn)
    e4m3_value(b)       a float8_e4m3fn byte -> fp32 (exact)
    ue8m0_value(b)      a UE8M0 byte -> 2**(b - 127) (0.0 for the byte 0, as kv_rows.ue8m0_values)
    pow2_ceil_exp(t)    E with 2**E = 2**ceil(log2 t), t positive normal fp32 (kv_rows.pow2_exponent)
    pow2(e)             2**e as fp32, e in [-126, 127] (exact)
    e2m1_code(q)        q in [-6, 6] -> the nearest e2m1 code, ties to the even code, sign in bit 3
    e2m1_value(c)       a 4-bit e2m1 code -> fp32 (exact)
    rotate(ev, od, c, s) the rope's (even, odd) pair rotated by (cos, sin)
    negate(x)           -x by its sign bit, as torch negates (-(+0.0) is -0.0 under every Triton)
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _bits(x):
    """The int32 bits of fp32 x."""
    return x.to(tl.int32, bitcast=True)


@triton.jit
def negate(x):
    """-x of fp32 x by flipping its sign bit: Triton 3.6 lowers `-x` to `0 - x`, which makes -(+0.0) +0.0."""
    return (_bits(x) ^ -2147483648).to(tl.float32, bitcast=True)


@triton.jit
def pow2(e):
    """2**e as fp32 for integer e in [-126, 127]."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def e4m3_code(x):
    """The float8_e4m3fn byte (int32, 0..255) of finite fp32 x with |x| <= 448, rounded to nearest even."""
    bits = _bits(x)
    sign = (bits >> 31) & 1
    a = tl.abs(x)
    # below 2**-6 the format's step is 2**-9: adding 2**14 (whose fp32 ulp is 2**-9) rounds to it, ties to even
    sub = ((a + 16384.0) - 16384.0) * 512.0
    ab = _bits(a)
    r = ab + 0x7FFFF + ((ab >> 20) & 1)  # round the fp32 mantissa to 3 bits, ties to even
    normal = ((((r >> 23) & 0xFF) - 120) << 3) | ((r >> 20) & 7)
    code = tl.where(a < 0.015625, sub.to(tl.int32), normal)
    return code | (sign << 7)


@triton.jit
def e4m3_value(b):
    """fp32 of a float8_e4m3fn byte b (int32)."""
    e = (b >> 3) & 15
    m = b & 7
    mag = tl.where(
        e == 0, m.to(tl.float32) * 0.001953125, (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    )
    return tl.where((b & 128) != 0, negate(mag), mag)


@triton.jit
def ue8m0_value(b):
    """fp32 2**(b - 127) of a UE8M0 byte b (int32); 0.0 for 0."""
    return (b << 23).to(tl.float32, bitcast=True)


@triton.jit
def pow2_ceil_exp(t):
    """int32 E = ceil(log2 t) of positive normal fp32 t (frexp's exponent, less one at an exact power of two)."""
    bits = _bits(t)
    field = (bits >> 23) & 0xFF
    return tl.where((bits & 0x7FFFFF) == 0, field - 127, field - 126)


@triton.jit
def e2m1_code(q):
    """The 4-bit e2m1 code (int32) of fp32 q in [-6, 6]: nearest magnitude, ties to the even code, sign bit 3."""
    a = tl.abs(q)
    mag = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
           + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32)
           + (a > 5.0).to(tl.int32))  # fmt: skip
    return mag | (((_bits(q) >> 31) & 1) << 3)


@triton.jit
def e2m1_value(c):
    """fp32 of a 4-bit e2m1 code c (int32): 0, 0.5, 1, 1.5, 2, 3, 4, 6, signed by bit 3."""
    i = c & 7
    e = i >> 1
    big = (1.0 + (i & 1).to(tl.float32) * 0.5) * pow2(e - 1)
    mag = tl.where(i < 2, i.to(tl.float32) * 0.5, big)
    return tl.where((c & 8) != 0, negate(mag), mag)


@triton.jit
def rotate(even, odd, cos, sin):
    """(even * cos - odd * sin, even * sin + odd * cos): the rope's rotation of one pair."""
    return even * cos - odd * sin, even * sin + odd * cos
