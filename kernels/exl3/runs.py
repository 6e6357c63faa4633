"""EXL3 decode in 32-position runs: each element cuts 32 states out of K + 1 words it loads once.

Stream positions 32c .. 32c + 31 of a tile (MMA lanes 4c .. 4c + 3, spec exl3.md §5) own ring bits
[32Kc, 32K(c + 1)): for an integer width K these are the K whole words Kc .. Kc + K - 1, and their 16-bit
windows reach back at most 15 bits into word Kc - 1 (word nw - 1 for c = 0: the ring wraps, §3.1). So one
element = one (tile, run) loads K + 1 consecutive words and takes every state out of them at word indices
and shifts known at compile time: no per-weight gathers. The run's 32 positions fall on tile columns c and
c + 8 and on every tile row, so a block of 8 tiles along n yields 128 columns as two [8, 8] sums.
Several rows (runs_rows) share the decode: a leading row axis on the sums, each weight times every row.
"""

from __future__ import annotations

import triton
import triton.language as tl
from tfc.kernels.exl3.tl import USE_ASM, cb_decode, codebook_ptx

# Two states in, two fp32 values out: the codebook as in exl3_tl (bit-exact fp16) plus the widening.
_MUL1_F32 = tl.constexpr(codebook_ptx(2, widen=True))
_3INST_F32 = tl.constexpr(codebook_ptx(0, widen=True))
_MCG_F32 = tl.constexpr(codebook_ptx(1, widen=True))


@triton.jit
def cb_decode2_f32(sa, sb, CB: tl.constexpr):
    """Codebook CB of two uint32 state tensors -> two fp32 tensors (the fp16 value, widened exactly)."""
    if USE_ASM:
        if CB == 2:
            asm: tl.constexpr = _MUL1_F32
        elif CB == 1:
            asm: tl.constexpr = _MCG_F32
        else:
            asm: tl.constexpr = _3INST_F32
        va, vb = tl.inline_asm_elementwise(
            asm, "=f,=f,r,r", [sa, sb], dtype=(tl.float32, tl.float32), is_pure=True, pack=1
        )
    else:
        va = cb_decode(sa, CB).to(tl.float32)
        vb = cb_decode(sb, CB).to(tl.float32)
    return va, vb


@triton.jit
def _word(ptr, m: tl.constexpr, c, K: tl.constexpr, NW: tl.constexpr):
    """Word m (0 = the one before the run, wrapping to NW - 1) of run c, as uint32."""
    if m == 0:
        idx = tl.where(c == 0, NW - 1, K * c - 1)
    else:
        idx = K * c + (m - 1)
    return tl.load(ptr + idx).to(tl.uint32, bitcast=True)


@triton.jit
def _pick(m: tl.constexpr, w0, w1, w2, w3, w4, w5, w6, w7, w8):
    """The m-th of the loaded words (m known at compile time)."""
    if m == 0:
        r = w0
    elif m == 1:
        r = w1
    elif m == 2:
        r = w2
    elif m == 3:
        r = w3
    elif m == 4:
        r = w4
    elif m == 5:
        r = w5
    elif m == 6:
        r = w6
    elif m == 7:
        r = w7
    else:
        r = w8
    return r


@triton.jit
def _state(q: tl.constexpr, K: tl.constexpr, w0, w1, w2, w3, w4, w5, w6, w7, w8):
    """State of run position q: the 16 bits ending at local bit 32 + (q + 1) K (MSB-first, word 0 first)."""
    last: tl.constexpr = 32 + (q + 1) * K - 1
    m: tl.constexpr = last // 32
    sh: tl.constexpr = 31 - last % 32
    lo = _pick(m, w0, w1, w2, w3, w4, w5, w6, w7, w8)
    if sh <= 16:
        s = (lo >> sh) & 0xFFFF
    else:
        hi = _pick(m - 1, w0, w1, w2, w3, w4, w5, w6, w7, w8)
        s = ((lo >> sh) | (hi << (32 - sh))) & 0xFFFF
    return s


@triton.jit
def _tile_run(ptr, c, xrow, acc_a, acc_b, K: tl.constexpr, NW: tl.constexpr, CB: tl.constexpr):
    """Add one tile's run c (its 32 positions) into the column-c (acc_a) and column-c+8 (acc_b) sums.

    xrow: the input at the tile's first k row; with a leading row axis (pointers [R, ...], sums
    [R, ...]) every decoded weight meets all R rows by broadcasting.
    """
    w0 = _word(ptr, 0, c, K, NW)
    w1 = _word(ptr, 1, c, K, NW)
    w2 = w1
    w3 = w1
    w4 = w1
    w5 = w1
    w6 = w1
    w7 = w1
    w8 = w1
    if K >= 2:
        w2 = _word(ptr, 2, c, K, NW)
    if K >= 3:
        w3 = _word(ptr, 3, c, K, NW)
    if K >= 4:
        w4 = _word(ptr, 4, c, K, NW)
    if K >= 5:
        w5 = _word(ptr, 5, c, K, NW)
    if K >= 6:
        w6 = _word(ptr, 6, c, K, NW)
    if K >= 7:
        w7 = _word(ptr, 7, c, K, NW)
    if K >= 8:
        w8 = _word(ptr, 8, c, K, NW)
    for q in tl.static_range(0, 32, 2):
        sa = _state(q, K, w0, w1, w2, w3, w4, w5, w6, w7, w8)
        sb = _state(q + 1, K, w0, w1, w2, w3, w4, w5, w6, w7, w8)
        va, vb = cb_decode2_f32(sa, sb, CB)
        # Position q: lane 4c + q // 8, p = q % 8 (even) -> row 2 (q // 8) + 8 ((p >> 1) & 1), and q + 1
        # the next row; both on column c (p < 4) or c + 8 (spec §5). Same rows recur: loads are shared.
        xa = tl.load(xrow + (2 * (q // 8) + 8 * ((q % 8) // 2 % 2)))
        xb = tl.load(xrow + (2 * (q // 8) + 8 * ((q % 8) // 2 % 2) + 1))
        if q % 8 < 4:
            acc_a += xa * va
            acc_a += xb * vb
        else:
            acc_b += xa * va
            acc_b += xb * vb
    return acc_a, acc_b


@triton.jit
def _run_sums(ptr, c, xrow, zero, tn, kt_count, K: tl.constexpr, NW: tl.constexpr, CB: tl.constexpr,
              BKT: tl.constexpr, TPE: tl.constexpr):  # fmt: skip
    """Sums (a, b) of each element's TPE tiles (unused ones stay `zero`) over kt_count k-tiles, BKT at a time."""
    a0 = zero
    b0 = zero
    a1 = zero
    b1 = zero
    a2 = zero
    b2 = zero
    a3 = zero
    b3 = zero
    for _ in range(0, kt_count, BKT):
        a0, b0 = _tile_run(ptr, c, xrow, a0, b0, K, NW, CB)
        if TPE >= 2:
            a1, b1 = _tile_run(ptr + NW, c, xrow, a1, b1, K, NW, CB)
        if TPE >= 4:
            a2, b2 = _tile_run(ptr + 2 * NW, c, xrow, a2, b2, K, NW, CB)
            a3, b3 = _tile_run(ptr + 3 * NW, c, xrow, a3, b3, K, NW, CB)
        ptr += BKT * tn * NW
        xrow += BKT * 16
    return a0, b0, a1, b1, a2, b2, a3, b3


@triton.jit
def _element_runs(t_ptr, tn, NW: tl.constexpr, G: tl.constexpr, BKT: tl.constexpr, TPE: tl.constexpr):
    """Element (k-tile kt, group g, run c) of a column block: its first tile's word pointer, kt and c."""
    kt = tl.arange(0, BKT)[:, None, None]
    g = tl.arange(0, G)[None, :, None]
    c = tl.arange(0, 8)[None, None, :]
    return t_ptr + (kt * tn + g * TPE).to(tl.int64) * NW, kt, c


@triton.jit
def runs_cols(t_ptr, tn, kt_count, xh_ptr, W: tl.constexpr, CB: tl.constexpr, BKT: tl.constexpr,
              TPE: tl.constexpr = 2):  # fmt: skip
    """Sums over kt_count k-tiles of xh[row] * W-hat[row, col] for the 8-tile column block at t_ptr.

    t_ptr: int32 words of the block's first tile (tiles tn apart along k); xh_ptr: fp32 rotated input at
    the first row. Each element takes TPE (1, 2 or 4) tiles along n in turn, so that its 16 input rows
    are loaded once for all of them. Returns (a, b), each [8 nt, 8 c] fp32: a = column 16 nt + c, b =
    column 16 nt + 8 + c.
    """
    K: tl.constexpr = W // 16
    NW: tl.constexpr = W // 2
    G: tl.constexpr = 8 // TPE
    ptr, kt, c = _element_runs(t_ptr, tn, NW, G, BKT, TPE)
    xrow = xh_ptr + kt * 16
    a0, b0, a1, b1, a2, b2, a3, b3 = _run_sums(
        ptr, c, xrow, tl.zeros([BKT, G, 8], dtype=tl.float32), tn, kt_count, K, NW, CB, BKT, TPE
    )
    # Element (g, tile j) holds n-tile TPE g + j: interleave the per-j sums back into [8 nt, 8 c].
    a = tl.sum(a0, axis=0)
    b = tl.sum(b0, axis=0)
    if TPE >= 2:
        a = tl.reshape(tl.join(a, tl.sum(a1, axis=0)).permute(0, 2, 1), (2 * G, 8))
        b = tl.reshape(tl.join(b, tl.sum(b1, axis=0)).permute(0, 2, 1), (2 * G, 8))
    if TPE >= 4:
        a23 = tl.reshape(tl.join(tl.sum(a2, axis=0), tl.sum(a3, axis=0)).permute(0, 2, 1), (2 * G, 8))
        b23 = tl.reshape(tl.join(tl.sum(b2, axis=0), tl.sum(b3, axis=0)).permute(0, 2, 1), (2 * G, 8))
        a = tl.reshape(
            tl.join(tl.reshape(a, (G, 2, 8)), tl.reshape(a23, (G, 2, 8))).permute(0, 3, 1, 2), (8, 8)
        )
        b = tl.reshape(
            tl.join(tl.reshape(b, (G, 2, 8)), tl.reshape(b23, (G, 2, 8))).permute(0, 3, 1, 2), (8, 8)
        )
    return a, b


@triton.jit
def runs_rows(t_ptr, tn, kt_count, xh_ptr, stride_xh, M, dst, W: tl.constexpr, CB: tl.constexpr,
              BKT: tl.constexpr, TPE: tl.constexpr, MP: tl.constexpr):  # fmt: skip
    """runs_cols for the M <= MP rows of xh_ptr (stride_xh apart), stored as [MP, 128] fp32 rows at dst.

    The row axis leads the sums so that each thread keeps all MP rows of its element: one decode per
    weight. Rows M .. MP - 1 repeat row M - 1 (no masked loads); their sums are never read.
    """
    K: tl.constexpr = W // 16
    NW: tl.constexpr = W // 2
    G: tl.constexpr = 8 // TPE
    ptr, kt, c = _element_runs(t_ptr, tn, NW, G, BKT, TPE)
    m = tl.minimum(tl.arange(0, MP), M - 1)[:, None, None, None]
    xrow = xh_ptr + m * stride_xh + (kt * 16)[None, :, :, :]
    a0, b0, a1, b1, a2, b2, a3, b3 = _run_sums(
        ptr, c, xrow, tl.zeros([MP, BKT, G, 8], dtype=tl.float32), tn, kt_count, K, NW, CB, BKT, TPE
    )
    _store_rows(dst, a0, b0, 0, TPE)
    if TPE >= 2:
        _store_rows(dst, a1, b1, 1, TPE)
    if TPE >= 4:
        _store_rows(dst, a2, b2, 2, TPE)
        _store_rows(dst, a3, b3, 3, TPE)


@triton.jit
def _store_rows(dst, a, b, j: tl.constexpr, TPE: tl.constexpr):
    """Store tile j of runs_rows' per-element sums (a, b [MP, BKT, G, 8]): n-tile TPE g + j of each row."""
    MP: tl.constexpr = a.shape[0]
    G: tl.constexpr = a.shape[2]
    m = tl.arange(0, MP)[:, None, None]
    nt = (TPE * tl.arange(0, G) + j)[None, :, None]
    c = tl.arange(0, 8)[None, None, :]
    tl.store(dst + m * 128 + 16 * nt + c, tl.sum(a, axis=1))
    tl.store(dst + m * 128 + 16 * nt + 8 + c, tl.sum(b, axis=1))


@triton.jit
def store_cols(dst, a, b):
    """Write runs_cols' (a, b) as 128 consecutive fp32 columns at dst."""
    nt = tl.arange(0, 8)[:, None]
    c = tl.arange(0, 8)[None, :]
    tl.store(dst + 16 * nt + c, a)
    tl.store(dst + 16 * nt + 8 + c, b)


__all__ = ["runs_cols", "runs_rows", "store_cols"]
