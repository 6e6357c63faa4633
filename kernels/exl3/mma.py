"""EXL3 skinny GEMM on the matrix units with the decoded weights fed from registers (1-16 rows, one cost).

A 128-column block is 8 n-tiles; 4 / G warps take 2 G n-tiles each (G groups of two). Every thread runs the
PTX of exl3_mma_ptx on its own lane (one tensor element per thread), so Triton's register layouts never meet
the fragments. Rows are the mma's M (x as A) or, with the decoded tile as A (`wt`), its N: 1 to 16 rows
cost one decode. Inputs are the fp16 rotated rows (rotate_input, as on the other matrix-unit path; with `wt`
and up to 4 rows, fp16 high / low pairs of the fp32 ones), sums fp32. The CPU interpreter cannot run inline
PTX: tests/test_exl3_mma_ptx.py runs the same PTX in a small interpreter instead.
"""

from __future__ import annotations

import triton
import triton.language as tl
from tfc.kernels.exl3.mma_ptx import (
    SETUP_OUTPUTS,
    accumulators,
    frag_constraints,
    frag_ptx,
    load_constraints,
    load_ptx,
    setup_ptx,
    step_constraints,
    step_ptx,
    store_constraints,
    store_ptx,
)

GROUPS = (1, 2, 4)  # groups of two n-tiles per warp: 4, 2 or 1 warps per 128-column block
# Weights as A: up to this many input rows go in as fp16 high / low pairs (rows 2 m, 2 m + 1 of the 8 the mma
# takes), so the products see the fp32 rotated input to ~2^-22 at no extra mma.
SPLIT_MAX_ROWS = 4
# 16-row chunks one launch's programs take (each decoded tile multiplied into all of them): 1, 2 or 4
CHUNKS = (1, 2, 4)
SETUP_CONS = tl.constexpr(",".join(["=r"] * SETUP_OUTPUTS + ["r", "r"]))
FRAG_CONS = tl.constexpr(frag_constraints())
FRAG_CONS2 = tl.constexpr(frag_constraints(2))
FRAG_CONS4 = tl.constexpr(frag_constraints(4))
LOAD_CONS = tl.constexpr(load_constraints())
STEP_CONS = tl.constexpr(step_constraints(16))
STEP_CONS8 = tl.constexpr(step_constraints(8))
STEP_CONS32 = tl.constexpr(step_constraints(32, 2))
STEP_CONS64 = tl.constexpr(step_constraints(64, 4))
STORE_CONS = tl.constexpr(store_constraints(16))
STORE_CONS8 = tl.constexpr(store_constraints(8))
STORE_CONS32 = tl.constexpr(store_constraints(32))
STORE_CONS64 = tl.constexpr(store_constraints(64))


def mma_warps(groups: int) -> int:
    """Warps per program for `groups` groups of two n-tiles per warp."""
    if groups not in GROUPS:
        raise ValueError(f"mma groups {groups} is not one of {GROUPS}")
    return 4 // groups


def split_rows(wt: bool, rows: int, pairs: bool = True) -> bool:
    """Whether the weights-as-A decode carries each input row as an fp16 high / low pair (up to 4 rows, unless
    `pairs` is off)."""
    return pairs and wt and rows <= SPLIT_MAX_ROWS


def mma_asm(width: int, codebook: int, rows: int, groups: int, wt: bool = False, pairs: bool = True,
            chunks: int = 1) -> dict:  # fmt: skip
    """The constexpr PTX of one launch (integer width, codebook, 1-16 rows, or `chunks` 16-row chunks a program,
    groups per warp; wt: weights as the mma's A operand, exl3_mma_ptx.step_ptx; up to 4 rows then in high / low
    pairs unless `pairs` is off)."""
    if chunks not in CHUNKS or (chunks > 1 and groups != 1):
        raise ValueError(
            f"{chunks} chunks of 16 rows with {groups} groups: chunks are {CHUNKS}, beyond 1 one group"
        )
    split = split_rows(wt, rows, pairs) and chunks == 1
    k_bits, rows16 = width // 16, (2 * rows if split else rows) > 8 or chunks > 1
    return {
        "MMA_SETUP": setup_ptx(k_bits, 2 * groups, wt, split, chunks),
        "MMA_FRAG": frag_ptx(k_bits, rows16, chunks),
        "MMA_LOADS": tuple(load_ptx(k_bits, g) for g in range(groups)),
        "MMA_STEP": step_ptx(k_bits, codebook, wt, rows16, chunks),
        "MMA_STORES": tuple(store_ptx(g, wt, rows16, split, chunks) for g in range(groups)),
        "MMA_NACC": accumulators(wt, rows16) * chunks,
        "MMA_SPLIT": split,
        "MMA_CHUNKS": chunks,
    }


@triton.jit
def mma_frag(tb, xb, zi, o0, o1, o2, off, xo0, xo1, pf, FRAG: tl.constexpr, CH: tl.constexpr = 1):
    """The lane's input fragments (4 CH) and word addresses of the k-tile at tb (input rows at xb)."""
    return tl.inline_asm_elementwise(
        FRAG, FRAG_CONS4 if CH == 4 else (FRAG_CONS2 if CH == 2 else FRAG_CONS),
        [(tb + zi).to(tl.int64, bitcast=True), (xb + zi).to(tl.int64, bitcast=True), o0, o1, o2, off, xo0, xo1, pf],
        dtype=(tl.int32,) * (4 * CH) + (tl.int64, tl.int64, tl.int64), is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def mma_load(f, G: tl.constexpr, LOADS: tl.constexpr, SEL: tl.constexpr = 0, CH: tl.constexpr = 1):
    """Every group's words (six per group) at the word addresses of mma_frag's result f (the loads' PTX:
    LOADS[SEL * G + g])."""
    words = ()
    for g in tl.static_range(G):
        w = tl.inline_asm_elementwise(LOADS[SEL * G + g], LOAD_CONS, [f[4 * CH], f[4 * CH + 1], f[4 * CH + 2]],
                                      dtype=(tl.int32,) * 6, is_pure=True, pack=1)  # fmt: skip
        words = words + (w,)  # noqa: RUF005 (Triton's tuples are built by concatenation)
    return words


@triton.jit
def _frags(f, CH: tl.constexpr):
    """The 4 CH input fragments of mma_frag's result f."""
    out = ()
    for i in tl.static_range(4 * CH):
        out = out + (f[i],)  # noqa: RUF005 (Triton's tuples are built by concatenation)
    return out


@triton.jit
def mma_partials(t_ptr, tn, kt_count, xh_ptr, stride_xh, M, dst, W: tl.constexpr, G: tl.constexpr,
                 SETUP: tl.constexpr, FRAG: tl.constexpr, LOADS: tl.constexpr, STEP: tl.constexpr,
                 STORES: tl.constexpr, NACC: tl.constexpr = 16, SEL: tl.constexpr = 0,
                 CH: tl.constexpr = 1):  # fmt: skip
    """[16 CH, 128] fp32 sums at dst of the xh rows (fp16, stride_xh) times kt_count k-tiles of the block at t_ptr.

    LOADS and STORES hold G PTX strings per selection, the SEL-th G of them used (several widths in one
    launch: the MoE over a ragged table); Triton's constexpr tuples do not nest. CH 16-row chunks (one group):
    each decoded tile is multiplied into every chunk's sums.

    Software-pipelined: the next k-tile's words and input fragments are loaded before this one is decoded.
    """
    nw: tl.constexpr = W // 2
    zi = tl.full([32 * (4 // G)], 0, tl.int32)
    o0, o1, o2, off, xo0, xo1, pf, so = tl.inline_asm_elementwise(
        SETUP, SETUP_CONS, [zi + M, zi + stride_xh], dtype=(tl.int32,) * 8, is_pure=True, pack=1
    )
    z = tl.zeros([32 * (4 // G)], dtype=tl.float32)
    accs = ((z,) * NACC,) * G
    tb = t_ptr
    xb = xh_ptr
    f = mma_frag(tb, xb, zi, o0, o1, o2, off, xo0, xo1, pf, FRAG, CH)
    words = mma_load(f, G, LOADS, SEL, CH)
    for it in range(kt_count):
        # The next k-tile (the last round reloads its own, never past the end of the trellis).
        more = (it + 1 < kt_count).to(tl.int32)
        tb += more * (tn * nw)
        xb += more * 16
        fn = mma_frag(tb, xb, zi, o0, o1, o2, off, xo0, xo1, pf, FRAG, CH)
        words_n = mma_load(fn, G, LOADS, SEL, CH)
        new = ()
        for g in tl.static_range(G):
            step = tl.inline_asm_elementwise(
                STEP, STEP_CONS64 if NACC == 64 else (STEP_CONS32 if NACC == 32 else (STEP_CONS8 if NACC == 8 else STEP_CONS)),
                accs[g] + _frags(f, CH) + words[g] + (off,), dtype=(tl.float32,) * NACC, is_pure=True, pack=1,
            )  # fmt: skip
            new = new + (step,)  # noqa: RUF005 (Triton's tuples are built by concatenation)
        accs = new
        f = fn
        words = words_n
    dsti = (dst + zi).to(tl.int64, bitcast=True)
    for g in tl.static_range(G):
        tl.inline_asm_elementwise(
            STORES[SEL * G + g],
            STORE_CONS64 if NACC == 64 else (STORE_CONS32 if NACC == 32 else (STORE_CONS8 if NACC == 8 else STORE_CONS)),
            (dsti, so) + accs[g] + (zi + M,), dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip


__all__ = ["CHUNKS", "GROUPS", "SPLIT_MAX_ROWS", "mma_asm", "mma_partials", "mma_warps", "split_rows"]
