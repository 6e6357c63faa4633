"""The lane decode of EXL3 tiles: each lane of a 16x16 tile cuts its eight weights from the two or three words its
windows span (`window_span`; the mma B fragment's order, spec exl3.md §5), instead of two gathered words a weight.

`lane_tiles` decodes one k step of a 128-column block (TK tile rows of 8 tiles) into registers; the scratch
decode (kernels/exl3/scratch.py) stores them as 16-column runs, the tile path's product (kernels/exl3/rows.py)
arranges them as its [16 TK, 128] operand (`as_block`). `lane_words` (the loads) and `lane_cut` (the decode) are
its two halves, apart so a loop can load the next step's words before it decodes this step's. The values are
exl3_decode's W-hat, bit for bit (fp16 codebooks).
"""

from __future__ import annotations

import triton
import triton.language as tl
from tfc.kernels.exl3.tl import cb_either


def window_span(width: int) -> int:
    """Words a lane's window spans from the word of its first window's first bit, over a tile's 32 lanes, at
    width int16 words a tile (even widths; 0 for others)."""
    if width <= 0 or width % 2:
        return 0
    ring, last = 16 * width, ((8 * width) >> 4) - (width >> 4) + 16  # bits a tile; the eight windows' span
    return max(-(-((((8 * t + 1) * width >> 4) - 16) % ring % 32 + last) // 32) for t in range(32))


LANE_WORDS = tl.constexpr(tuple(window_span(w) for w in range(129)))  # by width: the words lane_words loads


@triton.jit
def _lane_geometry(W: tl.constexpr, TK: tl.constexpr):
    """Per lane of the step's TK x 8 tiles: its tile, lane t, first window bit, ring position and first word."""
    ring: tl.constexpr = 16 * W  # bits a tile
    g = tl.arange(0, TK * 8 * 32)  # the step's tiles (TK tile rows of 8 tile columns) x 32 lanes
    tile = g // 32
    t = g % 32
    first = (((8 * t + 1) * W) >> 4) - 16  # the lane's first window's first bit (before the ring wraps)
    at = (first + ring) % ring
    return tile, t, first, at, at >> 5


@triton.jit
def lane_words(block, tn, W: tl.constexpr, TK: tl.constexpr):
    """int32 words (w0, w1, w2, w3) of each lane's window for lane_tiles' step at block: the LANE_WORDS[W]
    its windows span (the others repeat the last one loaded, never used)."""
    nw: tl.constexpr = W // 2  # int32 words a tile
    tile, _, _, _, j0 = _lane_geometry(W, TK)
    words = block + ((tile // 8) * tn + tile % 8) * nw
    w0 = tl.load(words + j0)
    w1 = tl.load(words + (j0 + 1) % nw)
    w2 = w1
    if LANE_WORDS[W] > 2:
        w2 = tl.load(words + (j0 + 2) % nw)
    w3 = w2
    if LANE_WORDS[W] > 3:
        w3 = tl.load(words + (j0 + 3) % nw)
    return w0, w1, w2, w3


@triton.jit
def _funnel(hi, lo, sh):
    """uint32 bits [sh, sh + 32) of hi:lo, MSB first (sh in 0..31)."""
    v = (hi.to(tl.uint64) << 32) | lo.to(tl.uint64)
    return ((v << sh.to(tl.uint64)) >> 32).to(tl.uint32)


@triton.jit
def _aligned_state(n0, n1, n2, r: tl.constexpr):
    """The 16 bits at MSB-first bit r (constexpr) of n0:n1:n2, as uint32."""
    j: tl.constexpr = r // 32
    b: tl.constexpr = r % 32
    hi = n0
    lo = n1
    if j == 1:
        hi = n1
        lo = n2
    if b <= 16:
        st = hi >> (16 - b)
    else:
        st = (hi << (b - 16)) | (lo >> (48 - b))
    return st & 0xFFFF


@triton.jit
def _aligned_value(n0, n1, n2, q: tl.constexpr, cb, W: tl.constexpr, CB: tl.constexpr):
    """fp16 W-hat at stream position 8t + q of each lane, from its window shifted to bit 0 (n0, n1, n2)."""
    # bits from the lane's first window to its window q (8 t W / 16 is whole for even W)
    R: tl.constexpr = q * (W // 16) if W % 16 == 0 else (((q + 1) * W) >> 4) - (W >> 4)
    return cb_either(_aligned_state(n0, n1, n2, R), cb, CB)


@triton.jit
def lane_cut(w0, w1, w2, w3, cb, W: tl.constexpr, CB: tl.constexpr, TK: tl.constexpr):
    """lane_tiles from the lanes' words (lane_words): the words shifted once to start at the lane's first window (a
    funnel shift a word), then each state cut at a bit known when compiled."""
    _, _, _, at, _ = _lane_geometry(W, TK)
    off = (at & 31).to(tl.uint32)
    u0 = w0.to(tl.uint32, bitcast=True)
    u1 = w1.to(tl.uint32, bitcast=True)
    u2 = w2.to(tl.uint32, bitcast=True)
    n0 = _funnel(u0, u1, off)
    n1 = _funnel(u1, u2, off)
    n2 = n1
    SPAN: tl.constexpr = 16 + (7 * (W // 16) if W % 16 == 0 else ((8 * W) >> 4) - (W >> 4))
    if SPAN > 64:
        n2 = _funnel(u2, w3.to(tl.uint32, bitcast=True), off)
    v0 = _aligned_value(n0, n1, n2, 0, cb, W, CB)
    v1 = _aligned_value(n0, n1, n2, 1, cb, W, CB)
    v2 = _aligned_value(n0, n1, n2, 2, cb, W, CB)
    v3 = _aligned_value(n0, n1, n2, 3, cb, W, CB)
    v4 = _aligned_value(n0, n1, n2, 4, cb, W, CB)
    v5 = _aligned_value(n0, n1, n2, 5, cb, W, CB)
    v6 = _aligned_value(n0, n1, n2, 6, cb, W, CB)
    v7 = _aligned_value(n0, n1, n2, 7, cb, W, CB)
    v = tl.join(tl.join(tl.join(v0, v1), tl.join(v2, v3)), tl.join(tl.join(v4, v5), tl.join(v6, v7)))
    return tl.reshape(v, [TK * 8, 8, 4, 2, 2, 2])  # join adds its axis last: q's bits ql, qh, qc


@triton.jit
def lane_tiles(block, tn, cb, W: tl.constexpr, CB: tl.constexpr, TK: tl.constexpr):
    """fp16 [TK * 8, 8, 4, 2, 2, 2] (tile, tc, tr, ql, qh, qc): W-hat of the TK x 8 tiles whose first tile's
    words are at block (tiles tn apart along k, W int16 words a tile). Lane t = 4 tc + tr of a tile holds its
    positions 8t + q, q = 4 qc + 2 qh + ql: row 8 qh + 2 tr + ql, column 8 qc + tc of the tile."""
    w0, w1, w2, w3 = lane_words(block, tn, W, TK)
    return lane_cut(w0, w1, w2, w3, cb, W, CB, TK)


@triton.jit
def as_block(tiles, TK: tl.constexpr):
    """fp16 [16 TK, 128]: lane_tiles' values as the block's rows and columns."""
    # [tk, tile column, tc, tr, ql, qh, qc] -> rows (tk qh tr ql), columns (tile column, qc tc)
    v = tl.reshape(tiles, [TK, 8, 8, 4, 2, 2, 2])
    return tl.reshape(tl.permute(v, [0, 5, 3, 4, 1, 6, 2]), [TK * 16, 128])


__all__ = ["as_block", "lane_cut", "lane_tiles", "lane_words"]
