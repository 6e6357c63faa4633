"""Triton building blocks shared by the EXL3 kernels: tile window offsets, state extraction, codebooks, H128."""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
# On a GPU the codebooks run as packed PTX (two weights per instruction); the interpreter runs plain ops.
USE_ASM = tl.constexpr(not INTERPRET)

# Codebooks of two states (SA, SB) as PTX; DST gets the two fp16 values packed (spec exl3.md §4).
_MUL1_BODY = """.reg .b32 a, b, one, base, kinv, kbias;
mov.b32 one, 0x01010101;
mov.b32 base, 0x6400;
mov.b32 kinv, 0x1EEE1EEE;
mov.b32 kbias, 0xC931C931;
mul.lo.u32 a, SA, 0x83DCD12D;
mul.lo.u32 b, SB, 0x83DCD12D;
dp4a.u32.u32 a, a, one, base;
dp4a.u32.u32 b, b, one, base;
prmt.b32 a, a, b, 0x5410;
fma.rn.f16x2 DST, a, kinv, kbias;"""
_INST_BODY = """.reg .b32 a, b, lo, hi;
mad.lo.u32 a, SA, MULT, ADD;
mad.lo.u32 b, SB, MULT, ADD;
lop3.b32 a, a, 0x8FFF8FFF, 0x3B603B60, 0x6A;
lop3.b32 b, b, 0x8FFF8FFF, 0x3B603B60, 0x6A;
prmt.b32 lo, a, b, 0x5410;
prmt.b32 hi, a, b, 0x7632;
add.rn.f16x2 DST, lo, hi;"""
CODEBOOK_BODIES = {
    0: _INST_BODY.replace("MULT", "89226354").replace("ADD", "64248484"),
    1: _INST_BODY.replace("MULT", "0xCBAC1FED").replace("ADD", "0"),
    2: _MUL1_BODY,
}


def codebook_ptx(cb: int, widen: bool = False) -> str:
    """Inline PTX of codebook cb: states $1, $2 -> packed fp16 $0; widen: states $2, $3 -> fp32 $0, $1."""
    body = CODEBOOK_BODIES[cb]
    if not widen:
        return "{\n" + body.replace("SA", "$1").replace("SB", "$2").replace("DST", "$0") + "\n}"
    regs, ops = body.replace("SA", "$2").replace("SB", "$3").replace("DST", "a").split("\n", 1)
    return (
        "{\n"
        + regs
        + "\n.reg .b16 l, h;\n"
        + ops
        + "\nmov.b32 {l, h}, a;\ncvt.f32.f16 $0, l;\ncvt.f32.f16 $1, h;\n}"
    )


_MUL1_ASM = tl.constexpr(codebook_ptx(2))
_3INST_ASM = tl.constexpr(codebook_ptx(0))
_MCG_ASM = tl.constexpr(codebook_ptx(1))


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
def window_offsets(pos, width, tn, BK: tl.constexpr, BN: tl.constexpr, INT_RATE: tl.constexpr = False):
    """Word offsets (j, jp) of each element's 16-bit window inside its block, and the right shift.

    `pos` = tile_positions; `width` = int16 words per tile (constexpr or runtime); `tn` = tiles per k-row.
    Offsets are relative to the block's first tile, whose tiles sit at k-stride tn tiles. INT_RATE (width a
    multiple of 16) splits the window end into a row part and a column part that is a whole number of
    words, so the compiler sees that a thread's neighbouring columns read words a constant apart.
    """
    nw = width // 2
    kt = tl.arange(0, BK) // 16
    nt = tl.arange(0, BN) // 16
    tile = (kt[:, None] * tn + nt[None, :]) * nw
    if INT_RATE:
        r = tl.arange(0, BK) % 16
        c = tl.arange(0, BN) % 16
        row = 8 * ((r >> 1) & 3) + 2 * (r >> 3) + (r & 1)
        # i = row + 32 (c & 7) + 4 (c >> 3); (i + 1) W / 16 = (row + 1) W / 16 + 2 W (c & 7) + W / 4 (c >> 3).
        t = ((((row + 1) * width) >> 4) - 1)[:, None] + ((width // 4) * (c >> 3))[None, :]
        j = (t >> 5) + ((width // 16) * (c & 7))[None, :]
        shift = 31 - (t & 31)
    else:
        e1 = ((pos + 1) * width >> 4) - 1  # last ring bit of the window (spec §3.1/§3.2)
        j = e1 >> 5
        shift = 31 - (e1 & 31)
    jp = tl.where(j == 0, nw - 1, j - 1)
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
    if USE_ASM:
        # dp4a adds the four bytes onto 0x6400 = the fp16 bits of 1024 + b; one f16x2 FMA = __hfma.
        return tl.inline_asm_elementwise(_MUL1_ASM, "=r,r,r", [s], dtype=tl.float16, is_pure=True, pack=2)
    x = s * 0x83DCD12D
    pairs = (x & 0x00FF00FF) + ((x >> 8) & 0x00FF00FF)
    b = (pairs & 0xFFFF) + (pairs >> 16)
    # fp32 bits of 1024 + b (b < 1024) without an int->float conversion.
    h = (0x44800000 + (b << 13)).to(tl.float32, bitcast=True)
    return (h * 0.0067672729492187500 - 10.3828125).to(tl.float16)


@triton.jit
def cb_inst(s, mult, add, ASM: tl.constexpr = ""):
    """3INST (mult 89226354, add 64248484) / MCG (mult 0xCBAC1FED, add 0): LOP3 then sum of fp16 halves."""
    if USE_ASM and ASM != "":
        return tl.inline_asm_elementwise(ASM, "=r,r,r", [s], dtype=tl.float16, is_pure=True, pack=2)
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
        v = cb_inst(s, 0xCBAC1FED, 0, _MCG_ASM)
    else:
        v = cb_inst(s, 89226354, 64248484, _3INST_ASM)
    return v


@triton.jit
def cb_decode_rt(s, cb):
    """Codebook chosen at run time (per expert-table entry)."""
    if cb == 2:
        v = cb_mul1(s)
    elif cb == 1:
        v = cb_inst(s, 0xCBAC1FED, 0, _MCG_ASM)
    else:
        v = cb_inst(s, 89226354, 64248484, _3INST_ASM)
    return v


@triton.jit
def cb_either(s, cb, CB: tl.constexpr):
    """Codebook CB of states s, or cb read at run time (CB < 0: chosen per expert-table entry)."""
    if CB >= 0:
        v = cb_decode(s, CB)
    else:
        v = cb_decode_rt(s, cb)
    return v


@triton.jit
def decode_at(base, off_j, off_jp, shift, cb, CB: tl.constexpr):
    """fp16 W-hat values of the block at base (load_states' windows): codebook CB, or cb read at run time
    (CB < 0: chosen per expert-table entry)."""
    return cb_either(load_states(base, off_j, off_jp, shift), cb, CB)


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
def _butterfly(v, d: tl.constexpr):
    """One Walsh-Hadamard stage on axis d of a [2] * 7 tensor: (a, b) -> (a + b, a - b)."""
    # Bring axis d last (a literal permutation per axis), split it, join the sum and difference, put it back.
    if d == 0:
        a, b = tl.split(tl.permute(v, (1, 2, 3, 4, 5, 6, 0)))
        v = tl.permute(tl.join(a + b, a - b), (6, 0, 1, 2, 3, 4, 5))
    elif d == 1:
        a, b = tl.split(tl.permute(v, (0, 2, 3, 4, 5, 6, 1)))
        v = tl.permute(tl.join(a + b, a - b), (0, 6, 1, 2, 3, 4, 5))
    elif d == 2:
        a, b = tl.split(tl.permute(v, (0, 1, 3, 4, 5, 6, 2)))
        v = tl.permute(tl.join(a + b, a - b), (0, 1, 6, 2, 3, 4, 5))
    elif d == 3:
        a, b = tl.split(tl.permute(v, (0, 1, 2, 4, 5, 6, 3)))
        v = tl.permute(tl.join(a + b, a - b), (0, 1, 2, 6, 3, 4, 5))
    elif d == 4:
        a, b = tl.split(tl.permute(v, (0, 1, 2, 3, 5, 6, 4)))
        v = tl.permute(tl.join(a + b, a - b), (0, 1, 2, 3, 6, 4, 5))
    elif d == 5:
        a, b = tl.split(tl.permute(v, (0, 1, 2, 3, 4, 6, 5)))
        v = tl.permute(tl.join(a + b, a - b), (0, 1, 2, 3, 4, 6, 5))
    else:
        a, b = tl.split(v)
        v = tl.join(a + b, a - b)
    return v


@triton.jit
def fwht128(x):
    """x [128] fp32 -> x @ H128 (unnormalized), by seven butterfly stages instead of a 128x128 product."""
    v = tl.reshape(x, (2, 2, 2, 2, 2, 2, 2))
    for d in tl.static_range(7):
        v = _butterfly(v, d)
    return tl.reshape(v, (128,))


@triton.jit
def _block_stage(v, BM: tl.constexpr, H: tl.constexpr):
    """One butterfly stage on every row of v [BM, 128]: columns H apart, (a, b) -> (a + b, a - b)."""
    a, b = tl.split(tl.permute(tl.reshape(v, (BM, 64 // H, 2, H)), (0, 1, 3, 2)))
    return tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 1, 3, 2)), (BM, 128))


@triton.jit
def fwht128_block(x, BM: tl.constexpr):
    """x [BM, 128] fp32 -> each row @ H128 (unnormalized), by fwht128's seven butterfly stages in its order (the
    top bit's pairs first)."""
    v = _block_stage(x, BM, 64)
    v = _block_stage(v, BM, 32)
    v = _block_stage(v, BM, 16)
    v = _block_stage(v, BM, 8)
    v = _block_stage(v, BM, 4)
    v = _block_stage(v, BM, 2)
    return _block_stage(v, BM, 1)


@triton.jit
def finished(acc, svh_ptr, e, N, cols, BM: tl.constexpr, PER_ENTRY: tl.constexpr):
    """A tile's [BM, 128] sums as exl3_rows' _finish_kernel leaves them: had128 / sqrt(128) * svh_e (e: the
    tile's entry with PER_ENTRY, else 0), the same operations in the same order (launched without fp contraction)."""
    at = e.to(tl.int64) * N if PER_ENTRY else 0
    sv = tl.load(svh_ptr + at + cols).to(tl.float32)
    return fwht128_block(acc, BM) * 0.08838834764831845 * sv[None, :]


@triton.jit
def rotated128(x_row, suh_ptr, blk):
    """(x[blk .. blk + 127] * suh[blk ..]) @ H128 / sqrt(128) in fp32, by seven butterflies (in torch's
    fwht128_rows order: the top bit's pairs first)."""
    i = blk + tl.arange(0, 128)
    return (
        fwht128(tl.load(x_row + i).to(tl.float32) * tl.load(suh_ptr + i).to(tl.float32)) * 0.08838834764831845
    )


@triton.jit
def store_pair(dst, K, v, mask):
    """v as fp16 high part at dst and the fp16 rest at dst + K (a row pair the weights-as-A mma decode reads)."""
    hi = v.to(tl.float16)
    tl.store(dst, hi, mask=mask)
    tl.store(dst + K, (v - hi.to(tl.float32)).to(tl.float16), mask=mask)


@triton.jit
def sum_parts(src, nsum, part_stride, FLIGHT: tl.constexpr = 8):
    """Sum of nsum fp32 [128] vectors part_stride apart, FLIGHT loads in flight at a time, in a fixed order
    (8 inside a decode kernel: more would raise its registers; a launch of its own can afford more)."""
    c = tl.arange(0, 128)[None, :]
    tot = tl.zeros([128], dtype=tl.float32)
    for s0 in range(0, nsum, FLIGHT):
        s = s0 + tl.arange(0, FLIGHT)[:, None]
        parts = tl.load(src + s * part_stride + c, mask=s < nsum, other=0.0, cache_modifier=".cg")
        tot += tl.sum(parts, axis=0)
    return tot


@triton.jit
def rotate_sum(src, nsum, part_stride, row_stride, MP: tl.constexpr, FLIGHT: tl.constexpr = 8):
    """(sum over s < nsum of the [MP, 128] fp32 block at src + s * part_stride) @ H128 / sqrt(128).

    Reads the block from memory 32 columns at a time so that only a 32x128 slice of H128 is ever live
    (a whole H128 in registers would cap occupancy of the kernel's main loop). One row: FLIGHT parts loaded
    at a time (sum_parts).
    """
    if MP == 1:
        # One row: sum the parts, then butterflies (few registers; the product form needs ~100).
        return tl.reshape(fwht128(sum_parts(src, nsum, part_stride, FLIGHT)), (1, 128)) * 0.08838834764831845
    m = tl.arange(0, MP)
    out = tl.zeros([MP, 128], dtype=tl.float32)
    for q in tl.static_range(4):
        cols = q * 32 + tl.arange(0, 32)
        a = tl.zeros([MP, 32], dtype=tl.float32)
        for s in range(nsum):
            ptrs = src + s * part_stride + m[:, None] * row_stride + cols[None, :]
            a += tl.load(ptrs, cache_modifier=".cg")
        h = hadamard_block(32, 128, q * 32, 0)
        if MP >= 16:
            out = tl.dot(a, h, out, input_precision="tf32x3")
        else:
            out += tl.sum(a[:, :, None] * h[None, :, :], axis=1)
    return out * 0.08838834764831845


@triton.jit
def prefetch_rows(base, rows: tl.constexpr, row_words, row_bytes):
    """Ask for `rows` k-tile rows of a column block (row_words int32 words apart) to be pulled into L2."""
    if USE_ASM:
        for q in tl.static_range(rows):
            addr = (base + q * row_words).to(tl.int64, bitcast=True)
            tl.inline_asm_elementwise(
                "cp.async.bulk.prefetch.L2.global [$1], $2;\n mov.u32 $0, 0;",
                "=r,l,r",
                [addr, row_bytes],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )


@triton.jit
def release_fence():
    """Make this thread's global writes visible GPU-wide before a following arrival atomic."""
    if USE_ASM:
        tl.inline_asm_elementwise(
            "fence.acq_rel.gpu;\n mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1
        )
    tl.debug_barrier()


def next_pow2(v: int) -> int:
    """Smallest power of two >= v."""
    return triton.next_power_of_2(v)
