"""PTX for the EXL3 decode fed to the matrix units from registers (mma.sync m16n8k16, fp16 in, fp32 sums).

The tile order of spec exl3.md §5 is the m16n8k16 B-fragment order: lane t's stream positions 8t .. 8t + 7
are its b0..b3 of the tile's left 8 columns (p = 0..3) and right 8 columns (p = 4..7). So each lane decodes
its own 8 positions (ring bits [8tK - 16, 8tK + 8K), at most three words) and the warp multiplies without
any exchange. Five inline-asm pieces, each run by every thread once per element it holds (one):
  - `setup_ptx`: per-thread byte offsets (the lane's trellis words, its input rows, its output sums);
  - `frag_ptx`: per k-tile, the lane's A fragments (input rows) and word addresses;
  - `load_ptx`: the lane's words of two of the warp's n-tiles at that k-tile (issued a k-tile ahead);
  - `step_ptx`: those two n-tiles: decode, 4 mma into the running sums;
  - `store_ptx`: those sums (rows lane/4 and lane/4 + 8 of 16) into a [16, 128] fp32 partial block.
The lane's window is first shifted to start at a word boundary (one funnel shift per word), so every state
is then cut at a shift known here. Integer widths K = 1..8 only. `tests/test_exl3_mma_ptx.py` runs the
generated text in a small PTX interpreter against the reference decode.
"""

from __future__ import annotations

import functools
import itertools

from tfc.kernels.exl3.tl import CODEBOOK_BODIES

MMA = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
WORDS = 3  # word-offset outputs of setup_ptx (the most any width loads; unused ones are 0)
SETUP_OUTPUTS = WORDS + 5


def window_words(k_bits: int) -> tuple[int, int]:
    """(words a lane loads, words of its window once shifted to a word boundary)."""
    offmax = max((8 * t * k_bits - 16) % 32 for t in range(32))
    loads = -(-(offmax + 16 + 8 * k_bits) // 32)
    assert loads <= WORDS, k_bits
    return loads, -(-(16 + 8 * k_bits) // 32)


def setup_ptx(k_bits: int, nt: int, wt: bool = False, split: bool = False, chunks: int = 1) -> str:
    """Outputs $0.. = word byte offsets (WORDS, unused ones 0), shift, x offsets (rows lane/4, +8), row flags,
    output offset; inputs: M (x rows), x row stride (elements). nt n-tiles per warp; offsets include the
    warp's first n-tile. The lane's first output: x-as-A row lane / 4, column 2 (lane % 4); weights-as-A
    (wt) row 2 (lane % 4), column lane / 4; split (x rows 2 m, 2 m + 1 = the fp16 high and low parts of
    row m) row lane % 4, column lane / 4. Row flags: bits 2 c and 2 c + 1 say whether rows lane / 4 and
    lane / 4 + 8 of 16-row chunk c exist."""
    nwd, _ = window_words(k_bits)
    nw, ring = 8 * k_bits, 256 * k_bits
    o = [f"${i}" for i in range(WORDS)]
    off, xo0, xo1, pf, so = (f"${WORDS + i}" for i in range(5))
    m_rows, sx = f"${WORDS + 5}", f"${WORDS + 6}"
    lines = [
        ".reg .b32 lane, tid, nt, b, j0, idx, m0, m1, c, f0, f1, tmp;",
        ".reg .pred p;",
        "mov.u32 lane, %laneid;",
        "mov.u32 tid, %tid.x;",
        "shr.u32 nt, tid, 5;",
        f"mul.lo.u32 nt, nt, {nt};",
        # window start bit B = 8 lane K - 16 (mod R): its word j0 and the offset inside it
        f"mad.lo.u32 b, lane, {8 * k_bits}, {ring - 16};",
        f"setp.ge.u32 p, b, {ring};",
        f"@p sub.u32 b, b, {ring};",
        "shr.u32 j0, b, 5;",
        f"and.b32 {off}, b, 31;",
    ]
    for i in range(nwd):
        lines += [
            f"add.u32 idx, j0, {i};",
            f"setp.ge.u32 p, idx, {nw};",
            f"@p sub.u32 idx, idx, {nw};",
            f"mad.lo.u32 tmp, nt, {nw}, idx;",
            f"shl.b32 {o[i]}, tmp, 2;",
        ]
    lines += [f"mov.u32 {o[i]}, 0;" for i in range(nwd, WORDS)]
    lines += [
        "shr.u32 m0, lane, 2;",
        "and.b32 c, lane, 3;",
        "shl.b32 c, c, 1;",
        f"mad.lo.u32 tmp, m0, {sx}, c;",
        f"shl.b32 {xo0}, tmp, 1;",
        "add.u32 m1, m0, 8;",
        f"mad.lo.u32 tmp, m1, {sx}, c;",
        f"shl.b32 {xo1}, tmp, 1;",
        *_row_flags(m_rows, pf, chunks),
        f"mad.lo.u32 tmp, c, {64 if split else 128}, m0;" if wt else "mad.lo.u32 tmp, m0, 128, c;",
        "mad.lo.u32 tmp, nt, 16, tmp;",
        f"shl.b32 {so}, tmp, 2;",
    ]
    return "{\n" + "\n".join(lines) + "\n}"


def _row_flags(m_rows: str, pf: str, chunks: int) -> list[str]:
    """pf's bits 2 c, 2 c + 1: rows m0 + 16 c, m1 + 16 c are below M (one chunk: the same text as ever)."""
    if chunks == 1:
        return [f"setp.lt.u32 p, m0, {m_rows};", "selp.u32 f0, 1, 0, p;", f"setp.lt.u32 p, m1, {m_rows};",
                "selp.u32 f1, 2, 0, p;", f"or.b32 {pf}, f0, f1;"]  # fmt: skip
    lines = [f"mov.u32 {pf}, 0;"]
    for c in range(chunks):
        for bit, row in ((2 * c, "m0"), (2 * c + 1, "m1")):
            lines += [f"add.u32 tmp, {row}, {16 * c};", f"setp.lt.u32 p, tmp, {m_rows};",
                      f"selp.u32 f0, {1 << bit}, 0, p;", f"or.b32 {pf}, {pf}, f0;"]  # fmt: skip
    return lines


def _state(q: int, k_bits: int, dst: str) -> list[str]:
    """Instructions cutting state q (16 bits ending at bit 16 + (q + 1) K of the shifted window u0, u1, ...)."""
    last = 16 + (q + 1) * k_bits - 1
    m, sh = last // 32, 31 - last % 32
    if sh == 0:
        return [f"and.b32 {dst}, u{m}, 0xFFFF;"]
    if sh == 16:
        return [f"shr.u32 {dst}, u{m}, 16;"]
    if sh == 8:
        return [f"prmt.b32 {dst}, u{m}, z, 0x4421;"]
    if sh < 16:
        return [f"shr.u32 t, u{m}, {sh};", f"and.b32 {dst}, t, 0xFFFF;"]
    return [f"shf.r.clamp.b32 t, u{m}, u{m - 1}, {sh};", f"and.b32 {dst}, t, 0xFFFF;"]


@functools.cache
def byte_plan(k_bits: int) -> tuple[int, ...] | None:
    """Window bit offsets o of the registers X(o) (window bits [o, o + 32)) from which every state is cut by one
    byte permute, when that takes fewer instructions than `_state`; else None. A state starting at bit a sits
    at a byte boundary of X(o) when a - o is 0, 8 or 16; X(o) costs a funnel shift unless o is a word's start.
    Fewer instructions for K = 2 (11 against 14 per 8 states) and K = 4 (11 against 13)."""
    starts = [(q + 1) * k_bits for q in range(8)]
    _, nu = window_words(k_bits)
    cands = sorted({a - d for a in starts for d in (0, 8, 16) if a - d >= 0})
    cover = {o: frozenset(a for a in starts if a - o in (0, 8, 16)) for o in cands}
    best, now = None, sum(len(_state(q, k_bits, "s")) for q in range(8)) - 8
    for size in range(1, 5):
        for combo in itertools.combinations(cands, size):
            if frozenset().union(*(cover[o] for o in combo)) == frozenset(starts):
                cost = sum(0 if o % 32 == 0 and o // 32 < nu else 1 for o in combo)
                if cost < now and (best is None or cost < best[0]):
                    best = (cost, combo)
    return best[1] if best else None


def _byte_cut(k_bits: int, plan: tuple[int, ...], nu: int) -> list[str]:
    """The plan's registers x0.. (a funnel shift each, or a window word), then each state s_q by one permute."""
    lines = []
    for i, o in enumerate(plan):
        m, r = divmod(o, 32)
        low = f"u{m + 1}" if m + 1 < nu else "z"
        lines.append(f"mov.b32 x{i}, u{m};" if r == 0 else f"shf.l.clamp.b32 x{i}, {low}, u{m}, {r};")
    for q in range(8):
        a = (q + 1) * k_bits
        i = next(i for i, o in enumerate(plan) if a - o in (0, 8, 16))
        j = (
            16 - (a - plan[i])
        ) // 8  # the state's low byte in x_i (register bits 31 - (a - o) .. 16 - (a - o))
        lines.append(f"prmt.b32 s{q}, x{i}, z, 0x44{j + 1}{j};")
    return lines


def _codebook(cb: int, sa: str, sb: str, dst: str) -> str:
    """Codebook cb of states sa, sb into packed fp16 dst, in its own register scope."""
    return "{\n" + CODEBOOK_BODIES[cb].replace("SA", sa).replace("SB", sb).replace("DST", dst) + "\n}"


def frag_ptx(k_bits: int, rows16: bool, chunks: int = 1) -> str:
    """Per k-tile: outputs $0..$(4 chunks - 1) = the A fragments (fp16 pairs; rows >= M zero), four a 16-row chunk,
    then the lane's word addresses (64-bit); inputs: tile address, x address (row 0, this k-tile's first column),
    setup outputs (word offsets, shift, x offsets, row flags). rows16: rows 8..15 exist (else a1, a3 stay
    zero); chunk c's rows start 16 c rows on (twice the distance of the two x offsets). x is read through the
    read-only path (the rotation wrote it in an earlier launch)."""
    if chunks > 1 and not rows16:
        raise ValueError("chunks of 16 rows need rows16")
    a = [f"${i}" for i in range(4 * chunks)]
    wa = [f"${4 * chunks + i}" for i in range(WORDS)]
    base = 4 * chunks + WORDS
    tb, xb = f"${base}", f"${base + 1}"
    o = [f"${base + 2 + i}" for i in range(WORDS)]
    xo0, xo1, pf = (f"${base + 3 + WORDS + i}" for i in range(3))
    nwd, _ = window_words(k_bits)
    ldx = "ld.global.nc.b32"
    regs = ".reg .b32 t, cs, xo;" if chunks > 1 else ".reg .b32 t;"
    lines = [regs, ".reg .b64 xa;", ".reg .pred p;", *[f"mov.b32 {r}, 0;" for r in a]]
    if chunks > 1:
        lines += [f"sub.u32 cs, {xo1}, {xo0};", "shl.b32 cs, cs, 1;"]
    for c in range(chunks):
        halves = ((0, xo0), (1, xo1)) if rows16 else ((0, xo0),)
        for h, xoff in halves:
            lines += [f"and.b32 t, {pf}, {1 << (2 * c + h)};", "setp.ne.u32 p, t, 0;"]
            if c:
                lines += [f"mad.lo.u32 xo, cs, {c}, {xoff};", f"mad.wide.u32 xa, xo, 1, {xb};"]
            else:
                lines.append(f"mad.wide.u32 xa, {xoff}, 1, {xb};")
            lines += [f"@p {ldx} {a[4 * c + h]}, [xa];", f"@p {ldx} {a[4 * c + h + 2]}, [xa+16];"]
    lines += [f"mad.wide.u32 {wa[i]}, {o[i]}, 1, {tb};" for i in range(nwd)]
    lines += [f"mov.b64 {wa[i]}, {tb};" for i in range(nwd, WORDS)]
    return "{\n" + "\n".join(lines) + "\n}"


def frag_constraints(chunks: int = 1) -> str:
    """The constraint string of frag_ptx."""
    return ",".join(["=r"] * (4 * chunks) + ["=l"] * WORDS + ["l", "l"] + ["r"] * (WORDS + 4))


def load_ptx(k_bits: int, group: int) -> str:
    """The lane's words of n-tiles 2 group and 2 group + 1 at one k-tile: outputs $0.. = WORDS words per
    n-tile (unused ones 0); inputs: the word addresses (frag_ptx). Issued a k-tile ahead of step_ptx."""
    nwd, _ = window_words(k_bits)
    nw = 8 * k_bits
    wa = [f"${2 * WORDS + i}" for i in range(WORDS)]
    lines = []
    for j in range(2):
        tile = 2 * group + j
        lines += [f"ld.global.nc.b32 ${WORDS * j + i}, [{wa[i]}+{4 * nw * tile}];" for i in range(nwd)]
        lines += [f"mov.b32 ${WORDS * j + i}, 0;" for i in range(nwd, WORDS)]
    return "{\n" + "\n".join(lines) + "\n}"


def load_constraints() -> str:
    """The constraint string of load_ptx."""
    return ",".join(["=r"] * (2 * WORDS) + ["l"] * WORDS)


def step_ptx(k_bits: int, cb: int, wt: bool = False, rows16: bool = True, chunks: int = 1) -> str:
    """Two n-tiles of the warp's at one k-tile: outputs $0.. = the sums (accumulators(wt, rows16) of them);
    inputs: the same sums, the A fragments of x (frag_ptx), the two n-tiles' words (load_ptx), the shift.

    x-as-A (wt False): per n-tile two mma, x [16 rows, 16 k] times each 8-column half of the decoded tile;
    sums [n-tile j][half h][c0..c3]. Weights-as-A (wt True): the decoded tile, transposed, is the A operand
    (16 columns x 16 k; the lane's B-order registers v0..v3 become A's {v0, v2, v1, v3}) and x rows 0-7 the
    B operand (the frag_ptx registers a0, a2), rows 8-15 a second mma (a1, a3): one mma per tile and 8 rows,
    sums [n-tile j][row half r][c0..c3]. `chunks` 16-row chunks: each tile decoded once, then multiplied into
    every chunk's sums (chunk c's fragments a[4 c ..], its sums the c-th block of them).
    """
    nwd, nu = window_words(k_bits)
    per_chunk = accumulators(wt, rows16)
    nacc = per_chunk * chunks
    acc_out = [f"${i}" for i in range(nacc)]
    acc_in = [f"${nacc + i}" for i in range(nacc)]
    a = [f"${2 * nacc + i}" for i in range(4 * chunks)]
    words = [[f"${2 * nacc + 4 * chunks + WORDS * j + i}" for i in range(WORDS)] for j in range(2)]
    off = f"${2 * nacc + 4 * chunks + 2 * WORDS}"
    regs = ", ".join(f"u{i}" for i in range(nu))
    plan = byte_plan(k_bits)
    xregs = "".join(f", x{i}" for i in range(len(plan or ())))
    lines = [
        f".reg .b32 {regs}, s0, s1, s2, s3, s4, s5, s6, s7, v0, v1, v2, v3, z, t{xregs};",
        "mov.b32 z, 0;",
    ]
    per_tile = per_chunk // 2
    for j in range(2):
        w = words[j]
        # u_i = window bits [32 i, 32 i + 32): (w_i << off) | (w_i+1 >> (32 - off)); bits past the last
        # loaded word are never used (zero there).
        lines += [
            f"shf.l.clamp.b32 u{i}, {w[i + 1] if i + 1 < nwd else 'z'}, {w[i]}, {off};" for i in range(nu)
        ]
        if plan:
            lines += _byte_cut(k_bits, plan, nu)
        else:
            for q in range(8):
                lines += _state(q, k_bits, f"s{q}")
        lines += [_codebook(cb, f"s{2 * i}", f"s{2 * i + 1}", f"v{i}") for i in range(4)]
        for ch in range(chunks):
            fa, first = a[4 * ch : 4 * ch + 4], per_chunk * ch + per_tile * j
            for h in range(per_tile // 4):
                d = acc_out[first + 4 * h : first + 4 * h + 4]
                c = acc_in[first + 4 * h : first + 4 * h + 4]
                if wt:  # rows 8 h .. 8 h + 7 as B: (a0, a2) or (a1, a3)
                    ops = f"{{v0, v2, v1, v3}}, {{{fa[h]}, {fa[h + 2]}}}"
                else:  # x as A, the tile's half h as B
                    ops = f"{{{', '.join(fa)}}}, {{v{2 * h}, v{2 * h + 1}}}"
                lines.append(f"{MMA} {{{', '.join(d)}}}, {ops}, {{{', '.join(c)}}};")
    return "{\n" + "\n".join(lines) + "\n}"


def accumulators(wt: bool, rows16: bool) -> int:
    """fp32 sums a lane holds per group of two n-tiles: 16, or 8 with weights as A and at most 8 rows."""
    return 16 if not wt or rows16 else 8


def step_constraints(nacc: int = 16, chunks: int = 1) -> str:
    """The constraint string of step_ptx with nacc sums over `chunks` 16-row chunks."""
    return ",".join(["=f"] * nacc + ["f"] * nacc + ["r"] * (4 * chunks) + ["r"] * (2 * WORDS) + ["r"])


def store_ptx(group: int, wt: bool = False, rows16: bool = True, split: bool = False, chunks: int = 1) -> str:
    """Write one group's sums into the [16 chunks, 128] fp32 partial block: $0 = dummy output; $1 = block address,
    $2 = the lane's output offset (setup_ptx), $3.. = the sums (step_ptx's layout), then the mma's x rows
    (setup_ptx's M): rows past them are not written (nothing reads them; at one row that is 3 / 4 of the
    partial-sum traffic). split (weights as A, x rows in fp16 high / low pairs): each row's two sums added,
    so the block holds the real rows. Chunk c's rows are 16 c on."""
    per_chunk = accumulators(wt, rows16)
    per_tile = per_chunk // 2
    m_rows = f"${3 + per_chunk * chunks}"
    if wt:  # the lane's first row: 2 (lane % 4); split: the pair lane % 4, whose high row is 2 (lane % 4)
        first = ["and.b32 r0, lane, 3;", "shl.b32 r0, r0, 1;"]
        offsets = [0] if split else [8 * h + i for h in range(per_tile // 4) for i in range(2)]
    else:  # x as A: rows lane / 4 and lane / 4 + 8
        first = ["shr.u32 r0, lane, 2;"]
        offsets = [0, 8]
    preds = ", ".join(f"p{i}" for i in range(max(4, len(offsets) * chunks)))
    lines = [".reg .b64 ad;", ".reg .f32 hl;", ".reg .b32 lane, r0, r1;", f".reg .pred {preds};",
             "mad.wide.u32 ad, $2, 1, $1;", "mov.u32 lane, %laneid;", *first]  # fmt: skip
    for ch in range(chunks):
        for i, d in enumerate(offsets):  # p_(ch, i): row r0 + 16 ch + offsets[i] is a real row
            lines += [
                f"add.u32 r1, r0, {16 * ch + d};",
                f"setp.lt.u32 p{len(offsets) * ch + i}, r1, {m_rows};",
            ]
    for ch in range(chunks):
        base, pp = 8192 * ch, [f"p{len(offsets) * ch + i}" for i in range(len(offsets))]
        for j in range(2):
            col = base + 64 * (2 * group + j)  # the n-tile's first column, in bytes
            for h in range(per_tile // 4):
                s = [f"${3 + per_chunk * ch + per_tile * j + 4 * h + i}" for i in range(4)]
                if split:  # c0 + c1: column lane / 4, row lane % 4; c2 + c3: column + 8
                    lines += [f"add.f32 hl, {s[0]}, {s[1]};", f"@{pp[0]} st.global.f32 [ad+{col}], hl;",
                              f"add.f32 hl, {s[2]}, {s[3]};", f"@{pp[0]} st.global.f32 [ad+{col + 32}], hl;"]  # fmt: skip
                elif wt:  # c0, c1: column lane / 4, rows 8 h + 2 (lane % 4) + 0, 1; c2, c3: column + 8
                    row, pa, pb = 4096 * h, pp[2 * h], pp[2 * h + 1]
                    lines += [f"@{pa} st.global.f32 [ad+{col + row}], {s[0]};",
                              f"@{pb} st.global.f32 [ad+{col + row + 512}], {s[1]};",
                              f"@{pa} st.global.f32 [ad+{col + row + 32}], {s[2]};",
                              f"@{pb} st.global.f32 [ad+{col + row + 544}], {s[3]};"]  # fmt: skip
                else:  # c0, c1: row lane / 4, columns 2 (lane % 4) + 0, 1 of half h; c2, c3: row + 8
                    lines.append(f"@{pp[0]} st.global.v2.f32 [ad+{col + 32 * h}], {{{s[0]}, {s[1]}}};")
                    lines.append(f"@{pp[1]} st.global.v2.f32 [ad+{col + 32 * h + 4096}], {{{s[2]}, {s[3]}}};")
    lines.append("mov.u32 $0, 0;")
    return "{\n" + "\n".join(lines) + "\n}"


def store_constraints(nacc: int = 16) -> str:
    """The constraint string of store_ptx with nacc sums."""
    return ",".join(["=r", "l", "r"] + ["f"] * nacc + ["r"])


__all__ = [
    "SETUP_OUTPUTS",
    "WORDS",
    "accumulators",
    "frag_constraints",
    "frag_ptx",
    "load_constraints",
    "load_ptx",
    "setup_ptx",
    "step_constraints",
    "step_ptx",
    "store_constraints",
    "store_ptx",
    "window_words",
]
