"""The register-fed mma decode's PTX (kernels/exl3/mma_ptx.py), run by a small PTX interpreter on the CPU.

The interpreter executes the generated text for whole warps in lockstep: every integer, f16x2 and memory
instruction the generator emits, and mma.sync m16n8k16 as one warp-wide product (fp16 inputs exact, sums in
float64, rounded to fp32 once per mma). The partial sums it stores must equal xh [M, k] @ W-hat (the
reference decode, rotated domain) for rows < M and leave the padding rows of the (poisoned) block unwritten.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

pytest.importorskip("triton")

from tfc.kernels.exl3 import reference as ref
from tfc.kernels.exl3.mma_ptx import (
    SETUP_OUTPUTS,
    WORDS,
    accumulators,
    frag_ptx,
    load_ptx,
    setup_ptx,
    step_ptx,
    store_ptx,
)

M32 = 0xFFFFFFFF


def _parse(text: str) -> list[tuple[str | None, str, list[str]]]:
    """Instructions of an asm block: (predicate, opcode, operands); declarations and braces dropped."""
    out = []
    for raw in text.replace("{\n", "\n").replace("\n}", "\n").split("\n"):
        line = raw.strip().rstrip(";").strip()
        if not line or line.startswith(".reg") or line in ("{", "}"):
            continue
        pred = None
        if line.startswith("@"):
            pred, line = line[1:].split(" ", 1)
        op, _, rest = line.partition(" ")
        # operands: split on commas outside brackets/braces
        ops, depth, cur = [], 0, ""
        for ch in rest:
            if ch in "[{":
                depth += 1
            if ch in "]}":
                depth -= 1
            if ch == "," and depth == 0:
                ops.append(cur.strip())
                cur = ""
            else:
                cur += ch
        if cur.strip():
            ops.append(cur.strip())
        out.append((pred, op, ops))
    return out


def _h2(u: int) -> np.ndarray:
    return np.array([u & 0xFFFF, u >> 16], dtype=np.uint16).view(np.float16).astype(np.float64)


def _pack_h2(v: np.ndarray) -> int:
    h = v.astype(np.float16).view(np.uint16)
    return int(h[0]) | (int(h[1]) << 16)


def _f32(u: int) -> float:
    return float(np.array([u], dtype=np.uint32).view(np.float32)[0])


def _u32(f: float) -> int:
    return int(np.array([f], dtype=np.float32).view(np.uint32)[0])


class Warp:
    """32 lanes of registers over one flat little-endian memory (addresses are offsets into `mem`)."""

    def __init__(self, mem: np.ndarray, warp: int) -> None:
        self.mem, self.warp = mem, warp
        self.regs = [dict() for _ in range(32)]

    def val(self, lane: int, x: str, args: list) -> int:
        if x.startswith("$"):
            return args[lane][int(x[1:])]
        if x == "%laneid":
            return lane
        if x == "%tid.x":
            return 32 * self.warp + lane
        if re.fullmatch(r"-?(0x[0-9a-fA-F]+|\d+)", x):
            return int(x, 0) & 0xFFFFFFFFFFFFFFFF
        return self.regs[lane][x]

    def put(self, lane: int, x: str, v: int, args: list) -> None:
        if x.startswith("$"):
            args[lane][int(x[1:])] = v
        else:
            self.regs[lane][x] = v

    def load32(self, addr: int) -> int:
        return int(self.mem[addr : addr + 4].view(np.uint32)[0])

    def run(self, text: str, args: list[dict]) -> None:
        """Execute `text` on all lanes; args[lane] maps operand numbers to values (outputs written back)."""
        for pred, op, ops in _parse(text):
            if op.startswith("mma.sync"):
                self._mma(ops, args)
                continue
            for lane in range(32):
                if pred is not None and not self.regs[lane][pred]:
                    continue
                self._one(lane, op, ops, args)

    def _addr(self, lane: int, expr: str, args: list) -> int:
        base, _, imm = expr.strip("[]").partition("+")
        return self.val(lane, base, args) + (int(imm) if imm else 0)

    def _one(self, lane: int, op: str, ops: list[str], args: list) -> None:
        v = [self.val(lane, x, args) for x in ops[1:]] if not op.startswith(("ld.", "st.")) else None
        d = ops[0]
        name = op.split(".")[0]
        if op.startswith("ld.global"):
            self.put(lane, d, self.load32(self._addr(lane, ops[1], args)), args)
        elif op.startswith("st.global.v2.f32"):
            a = self._addr(lane, ops[0], args)
            pair = [self.val(lane, x.strip(), args) for x in ops[1].strip("{}").split(",")]
            self.mem[a : a + 8] = np.array(pair, dtype=np.uint32).view(np.uint8)
        elif op == "st.global.f32":
            a = self._addr(lane, ops[0], args)
            self.mem[a : a + 4] = np.array([self.val(lane, ops[1], args)], dtype=np.uint32).view(np.uint8)
        elif name == "mov":
            self.put(lane, d, v[0], args)
        elif name == "shr":
            self.put(lane, d, (v[0] & M32) >> v[1], args)
        elif name == "shl":
            self.put(lane, d, (v[0] << v[1]) & M32, args)
        elif name == "and":
            self.put(lane, d, v[0] & v[1], args)
        elif name == "or":
            self.put(lane, d, v[0] | v[1], args)
        elif name == "add" and op == "add.u32":
            self.put(lane, d, (v[0] + v[1]) & M32, args)
        elif name == "sub":
            self.put(lane, d, (v[0] - v[1]) & M32, args)
        elif op == "mul.lo.u32":
            self.put(lane, d, (v[0] * v[1]) & M32, args)
        elif op == "mad.lo.u32":
            self.put(lane, d, (v[0] * v[1] + v[2]) & M32, args)
        elif op == "mad.wide.u32":
            self.put(lane, d, (v[0] * v[1] + v[2]) & 0xFFFFFFFFFFFFFFFF, args)
        elif name == "setp":
            cmp = {"ge": v[0] >= v[1], "lt": v[0] < v[1], "ne": v[0] != v[1]}[op.split(".")[1]]
            self.put(lane, d, cmp, args)
        elif name == "selp":
            self.put(lane, d, v[0] if v[2] else v[1], args)
        elif op == "shf.l.clamp.b32":  # upper 32 bits of ({b, a} << min(c, 32))
            self.put(lane, d, (((v[1] << 32 | v[0]) << min(v[2], 32)) >> 32) & M32, args)
        elif op == "shf.r.clamp.b32":  # lower 32 bits of ({b, a} >> min(c, 32))
            self.put(lane, d, ((v[1] << 32 | v[0]) >> min(v[2], 32)) & M32, args)
        elif op == "prmt.b32":
            src = (v[1] << 32 | v[0]).to_bytes(8, "little")
            out = bytes(src[(v[2] >> (4 * i)) & 7] for i in range(4))
            self.put(lane, d, int.from_bytes(out, "little"), args)
        elif op == "dp4a.u32.u32":
            a, b = v[0].to_bytes(4, "little"), v[1].to_bytes(4, "little")
            self.put(lane, d, (sum(x * y for x, y in zip(a, b, strict=True)) + v[2]) & M32, args)
        elif op == "lop3.b32":
            a, b, c, lut = v
            r = 0
            for bit in range(32):
                idx = ((a >> bit) & 1) << 2 | ((b >> bit) & 1) << 1 | ((c >> bit) & 1)
                r |= ((lut >> idx) & 1) << bit
            self.put(lane, d, r, args)
        elif op == "add.f32":
            self.put(lane, d, _u32(np.float32(_f32(v[0])) + np.float32(_f32(v[1]))), args)
        elif op == "fma.rn.f16x2":
            self.put(lane, d, _pack_h2(_h2(v[0]) * _h2(v[1]) + _h2(v[2])), args)
        elif op == "add.rn.f16x2":
            self.put(lane, d, _pack_h2(_h2(v[0]) + _h2(v[1])), args)
        else:
            raise NotImplementedError(op)

    def _mma(self, ops: list[str], args: list) -> None:
        """D = A @ B + C for m16n8k16 (row A fp16, col B fp16, fp32 C/D) from the lanes' fragments."""
        dst, a, b, c = ([x.strip() for x in o.strip("{}").split(",")] for o in ops)
        am, bm, cm = np.zeros((16, 16)), np.zeros((16, 8)), np.zeros((16, 8))
        for lane in range(32):
            g, t = lane // 4, lane % 4
            ar = [_h2(self.val(lane, x, args)) for x in a]
            for i, (r, col) in enumerate([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)]):
                am[r, col : col + 2] = ar[i]
            br = [_h2(self.val(lane, x, args)) for x in b]
            bm[2 * t : 2 * t + 2, g] = br[0]
            bm[2 * t + 8 : 2 * t + 10, g] = br[1]
            cr = [_f32(self.val(lane, x, args)) for x in c]
            cm[g, 2 * t : 2 * t + 2] = cr[0:2]
            cm[g + 8, 2 * t : 2 * t + 2] = cr[2:4]
        dm = (am @ bm + cm).astype(np.float32)
        for lane in range(32):
            g, t = lane // 4, lane % 4
            vals = [dm[g, 2 * t], dm[g, 2 * t + 1], dm[g + 8, 2 * t], dm[g + 8, 2 * t + 1]]
            for x, f in zip(dst, vals, strict=True):
                self.put(lane, x, _u32(f), args)


def run_block(trellis: np.ndarray, xh: np.ndarray, cb: int, groups: int, wt: bool = False,
              split: bool = False, chunks: int = 1) -> np.ndarray:  # fmt: skip
    """The [16 chunks, 128] partial sums of one 128-column block over all k-tiles, as the GPU kernel computes them
    (4 // groups warps of 2 groups n-tiles each; wt: weights as the mma's A operand; split: xh (fp32) goes
    in as fp16 high / low row pairs; chunks: 16-row chunks multiplied by each decoded tile)."""
    tk, tn, width = trellis.shape
    k_bits, nw = width // 16, width // 2
    if split:
        hi = xh.astype(np.float16)
        lo = (xh - hi.astype(np.float32)).astype(np.float16)
        xh = np.stack([hi, lo], axis=1).reshape(-1, xh.shape[1])  # rows 2 m, 2 m + 1
    m_rows, k = xh.shape
    rows_out = 16 * chunks
    words = ref.words32(trellis).astype(np.uint32)  # [tk, tn, nw]
    tsize, xsize = words.nbytes, xh.nbytes
    mem = np.zeros(tsize + xsize + rows_out * 128 * 4 + 64, dtype=np.uint8)
    mem[:tsize] = words.reshape(-1).view(np.uint8)
    xbase, wsbase = tsize, tsize + xsize
    mem[xbase : xbase + xsize] = xh.astype(np.float16).reshape(-1).view(np.uint8)
    mem[wsbase : wsbase + rows_out * 128 * 4] = np.full(rows_out * 128, np.nan, np.float32).view(np.uint8)
    nso, rows16 = SETUP_OUTPUTS, m_rows > 8 or chunks > 1
    nacc = accumulators(wt, rows16) * chunks
    nf = 4 * chunks  # the fragments frag_ptx returns before the word addresses
    setup, frag = setup_ptx(k_bits, 2 * groups, wt, split, chunks), frag_ptx(k_bits, rows16, chunks)
    loads, step = [load_ptx(k_bits, g) for g in range(groups)], step_ptx(k_bits, cb, wt, rows16, chunks)
    for w in range(4 // groups):
        warp = Warp(mem, w)
        sargs = [{nso: m_rows, nso + 1: k} for _ in range(32)]
        warp.run(setup, sargs)
        acc = [[[0] * nacc for _ in range(groups)] for _ in range(32)]
        for kt in range(tk):
            fargs = [{nf + WORDS: 4 * nw * kt * tn, nf + 1 + WORDS: xbase + 2 * 16 * kt,
                      **{nf + 2 + WORDS + i: sargs[lane][i] for i in range(WORDS + 4)}}
                     for lane in range(32)]  # fmt: skip
            warp.run(frag, fargs)
            for g in range(groups):
                largs = [{2 * WORDS + i: fargs[lane][nf + i] for i in range(WORDS)} for lane in range(32)]
                warp.run(loads[g], largs)
                args = [{**{nacc + i: acc[lane][g][i] for i in range(nacc)},
                         **{2 * nacc + i: fargs[lane][i] for i in range(nf)},
                         **{2 * nacc + nf + i: largs[lane][i] for i in range(2 * WORDS)},
                         2 * nacc + nf + 2 * WORDS: sargs[lane][WORDS]}
                        for lane in range(32)]  # fmt: skip
                warp.run(step, args)
                for lane in range(32):
                    acc[lane][g] = [args[lane][i] for i in range(nacc)]
        for g in range(groups):
            store_args = [{1: wsbase, 2: sargs[lane][nso - 1], **{3 + i: acc[lane][g][i] for i in range(nacc)},
                           3 + nacc: m_rows} for lane in range(32)]  # fmt: skip
            warp.run(store_ptx(g, wt, rows16, split, chunks), store_args)
    return mem[wsbase : wsbase + rows_out * 128 * 4].view(np.float32).reshape(rows_out, 128)


MMA_CASES = [(2, 2, 1, 1), (3, 2, 5, 2), (4, 0, 16, 1), (5, 1, 9, 4), (6, 2, 3, 2), (7, 2, 1, 1), (8, 1, 16, 2),
             (1, 0, 2, 4)]  # fmt: skip


@pytest.mark.parametrize("wt", [False, True], ids=["x_as_a", "weights_as_a"])
@pytest.mark.parametrize(("k_bits", "cb", "rows", "groups"), MMA_CASES)
def test_mma_ptx_matches_reference(k_bits, cb, rows, groups, wt):
    rng = np.random.default_rng(k_bits * 100 + rows)
    tk = 3
    trellis = rng.integers(-32768, 32768, size=(tk, 8, 16 * k_bits), dtype=np.int16)
    xh = rng.standard_normal((rows, 16 * tk)).astype(np.float16)
    got = run_block(trellis, xh, cb, groups, wt)
    what = ref.decode_rotated(trellis, cb).astype(np.float64)  # [k, 128] fp16 values
    want = xh.astype(np.float64) @ what
    err = np.abs(got[:rows] - want).max() / np.abs(want).max()
    assert err < 1e-6, err  # fp16 products are exact; fp32 sums rounded once per mma (3 k-tiles)
    # Rows past the input are never written (the block was poisoned with NaN), in either layout.
    assert np.isnan(got[rows:]).all(), "padding rows must not be written"


@pytest.mark.parametrize(
    ("k_bits", "cb", "rows", "chunks", "wt"),
    [(2, 2, 17, 2, True), (5, 1, 41, 4, True), (6, 2, 49, 4, True), (4, 0, 64, 4, False)],
)  # the row-free launches take the weights as A; x as A once
def test_mma_ptx_chunks_share_each_decoded_tile(k_bits, cb, rows, chunks, wt):
    """Up to 4 chunks of 16 rows multiplied by each decoded tile: every row's sums are the bits it gets in its
    own 16-row launch (chunk c of the rows alone), and rows past the input are never written."""
    rng = np.random.default_rng(k_bits * 1000 + rows)
    tk = 3
    trellis = rng.integers(-32768, 32768, size=(tk, 8, 16 * k_bits), dtype=np.int16)
    xh = rng.standard_normal((rows, 16 * tk)).astype(np.float16)
    got = run_block(trellis, xh, cb, 1, wt, chunks=chunks)
    for c in range(0, rows, 16):
        alone = run_block(trellis, xh[c : c + 16], cb, 1, wt)
        n = min(16, rows - c)
        assert np.array_equal(got[c : c + n], alone[:n]), c
    assert np.isnan(got[rows:]).all(), "padding rows must not be written"
    what = ref.decode_rotated(trellis, cb).astype(np.float64)
    want = xh.astype(np.float64) @ what
    assert np.abs(got[:rows] - want).max() / np.abs(want).max() < 1e-6


@pytest.mark.parametrize(
    ("k_bits", "cb", "rows", "groups"), [(2, 2, 1, 1), (4, 0, 4, 2), (6, 2, 3, 4), (5, 1, 2, 1)]
)
def test_mma_ptx_split_rows_keep_fp32_input(k_bits, cb, rows, groups):
    """Weights as A, <= 4 rows as fp16 high / low pairs: the sums see the fp32 rotated input (not its fp16)."""
    rng = np.random.default_rng(k_bits * 10 + rows)
    tk = 3
    trellis = rng.integers(-32768, 32768, size=(tk, 8, 16 * k_bits), dtype=np.int16)
    xh = rng.standard_normal((rows, 16 * tk)).astype(np.float32)
    got = run_block(trellis, xh, cb, groups, wt=True, split=True)
    what = ref.decode_rotated(trellis, cb).astype(np.float64)
    want = xh.astype(np.float64) @ what
    err = np.abs(got[:rows] - want).max() / np.abs(want).max()
    assert err < 1e-6, err  # the fp16 input alone would be ~1e-4 off
    rounded = xh.astype(np.float16).astype(np.float64) @ what
    assert np.abs(rounded - want).max() / np.abs(want).max() > 1e-5  # so the test can tell the two apart
    assert np.isnan(got[rows:]).all(), "padding rows must not be written"


def test_mma_config_resolves():
    """GemmConfig(mma=G): the matrix-unit input (fp16 rotated rows), 4 / G warps, 8 G programs per SM."""
    from tfc.kernels.exl3.gemv import GemmConfig

    cfg = GemmConfig(mma=2).resolved(1, 64)
    assert (cfg.use_dot, cfg.runs, cfg.fuse_rotation, cfg.num_warps, cfg.waves) == (
        True,
        False,
        False,
        2,
        16.0,
    )
    assert not cfg.reduce_apart and GemmConfig(mma=2).resolved(2, 64).reduce_apart
    assert cfg.mma_wt and not GemmConfig(mma=2).resolved(9, 64).mma_wt  # weights as A up to 8 rows
    with pytest.raises(ValueError, match="mma groups 3"):
        GemmConfig(mma=3).resolved(4, 64)


@pytest.mark.parametrize(
    ("rows", "k", "n", "width", "groups", "wt"),
    [(1, 5120, 2304, 64, 0, False), (1, 1280, 32768, 64, 4, True), (1, 5120, 129280, 96, 4, True),
     (2, 5120, 2304, 64, 1, True), (8, 8192, 5120, 64, 4, True), (4, 1280, 32768, 64, 4, True),
     (4, 5120, 129280, 96, 4, True), (16, 2304, 5120, 32, 1, False), (16, 8192, 5120, 64, 2, False),
     (16, 5120, 129280, 96, 4, False), (4, 5120, 2304, 40, 0, False)],
)  # fmt: skip
def test_mma_gpu_defaults(rows, k, n, width, groups, wt):
    """On a GPU, integer widths take the mma decode from 2 rows and at one row from mma_wide_weights weights
    (a routed expert keeps the run decode); up to 8 rows with the weights as A, 4 groups from mma_wide_weights
    (benchmarks/summaries/kernels.md); half-integer widths keep the matrix-unit gather; the interpreter
    never."""
    from tfc.kernels.exl3.gemv import GemmConfig

    cfg = GemmConfig().resolved(rows, width, n, k, ptx=True)
    assert (cfg.mma, cfg.mma_wt) == (groups, wt)
    # the partials summed apart: the mma decode from 2 rows, the run decode at one row
    # (benchmarks/summaries/kernels.md)
    assert cfg.reduce_apart == (rows > 1 if groups else rows == 1 and width % 16 == 0)
    # programs per SM: 8 per group; with the weights as A on the head, 128 (benchmarks/summaries/kernels.md)
    if groups:
        assert cfg.waves == (128.0 if wt and n > 32768 else 8.0 * groups)
    assert GemmConfig().resolved(rows, width, n, k, ptx=False).mma == 0
    assert GemmConfig(use_dot=True).resolved(rows, width, n, k, ptx=True).mma == 0  # asked-for paths stay
    assert GemmConfig(mma_wt=False).resolved(rows, width, n, k, ptx=True).mma_wt is False


class _Launch:
    """Stands in for a Triton kernel: records each launch's grid, arguments and keywords."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((grid, args, kw))


def test_mma_input_reads_the_read_only_path():
    """The rotated input (written by an earlier launch) goes through the read-only path, as the trellis words."""
    assert "ld.global.nc.b32" in frag_ptx(4, False) and "ld.global.nc.b32" in load_ptx(4, 0)


@pytest.fixture
def stubbed(monkeypatch):
    """exl3_gemv with its kernels stubbed, and a random 512 x 256 4-bit group: (module, stubs, group)."""
    import torch
    from tfc.kernels.exl3 import gemv as exl3_gemv

    stubs = {name: _Launch() for name in ("_exl3_gemm_kernel", "_rotate_kernel", "reduce_kernel")}
    for name, stub in stubs.items():
        monkeypatch.setattr(exl3_gemv, name, stub)
    k, n = 512, 256
    gen = torch.Generator().manual_seed(3)
    trellis = torch.randint(-32768, 32768, (k // 16, n // 16, 64), dtype=torch.int16, generator=gen)
    suh, svh = torch.randn(k, generator=gen).half(), torch.randn(n, generator=gen).half()
    return exl3_gemv, stubs, (trellis, suh, svh, 2)


@pytest.mark.parametrize(("rows", "pairs"), [(1, True), (3, True), (4, True), (6, False), (16, False)])
def test_weights_as_a_host_side(stubbed, rows, pairs):
    """exl3_gemm's launches for GemmConfig(mma_wt=True), kernels stubbed (no GPU): up to 4 rows the rotation
    writes fp16 high / low pairs [M, 2, k] and the kernel reads 2 M x rows with 8 sums per group; the row
    stride is k either way; more than one row sums the partials apart, one program per (block, row, group)."""
    import torch

    gemv, stubs, group = stubbed
    k, n = 512, 256
    cfg = gemv.GemmConfig(mma=2, mma_wt=True)
    gemv.exl3_gemm(torch.randn(rows, k).half(), *group, config=cfg, out=torch.empty(rows, n))
    ((_, rargs, rkw),) = stubs["_rotate_kernel"].calls
    assert rkw["SPLIT"] == pairs and rargs[2].shape == ((rows, 2, k) if pairs else (rows, k))
    assert rargs[2].dtype == torch.float16
    ((_, args, kw),) = stubs["_exl3_gemm_kernel"].calls
    assert kw["MMA"] == 2 and kw["MMA_SPLIT"] == pairs and kw["MMA_NACC"] == (16 if rows > 8 else 8)
    assert args[8] == rows and args[10] == k  # M (the real rows) and the x row stride
    assert kw["REDUCE"] == (rows == 1) and kw["LIVE"] == rows
    reduce = stubs["reduce_kernel"].calls
    assert [c[0] for c in reduce] == ([] if rows == 1 else [(n // 128, rows, 1)])  # one group
    # A pre-rotated input must be rotate_for's form for this config.
    with pytest.raises(ValueError, match="rotate_for"):
        wrong = torch.randn(rows, k).half() if pairs else torch.randn(rows, 2, k)
        gemv.exl3_gemm(wrong, *group, config=cfg, x_rotated=True)


def test_the_mma_decode_takes_its_rotation_apart(stubbed):
    """GemmConfig(mma=G) resolves to the rotation in a launch of its own, and fuse_rotation asked of it is refused
    in one line (only the one-row run decode fuses it)."""
    import torch

    gemv, _, group = stubbed
    assert not gemv.GemmConfig(mma=2, mma_wt=True).resolved(1, 64).fuse_rotation
    with pytest.raises(ValueError, match="only the one-row run decode fuses"):
        gemv.exl3_gemm(torch.randn(1, 512).half(), *group, config=gemv.GemmConfig(mma=2, fuse_rotation=True))


def test_moe_mma_host_side(monkeypatch):
    """moe_exl3 with MoeConfig(mma=G), kernels stubbed (no GPU): a program a group of pairs, the rotation writes
    each pair's rows as fp16 high / low pairs [2, P, 2, D], the activation for the down projection is [P, 2, I] fp16, both launches get
    the weights-as-A PTX of their tables (8 sums, one k-tile per step, 4 / G warps), per width on a ragged table;
    half-integer widths and unknown group counts are refused."""
    import torch
    from tfc.kernels.exl3 import moe
    from tfc.kernels.exl3.expert_table import ExpertTable
    from tfc.kernels.exl3.mma import mma_asm
    from tfc.kernels.exl3.moe_order import PairOrder

    stubs = {name: _Launch() for name in ("_moe_rotate_kernel", "_moe_gate_up_kernel", "_moe_down_kernel")}
    for name, stub in stubs.items():
        monkeypatch.setattr(moe, name, stub)
    zeros = torch.zeros(8, dtype=torch.int32)
    monkeypatch.setattr(
        moe, "order_pairs", lambda ids, routed, group: PairOrder(zeros, zeros, zeros, zeros[:1], 4)
    )
    gen = torch.Generator().manual_seed(5)
    d, inter, routed, topk, tokens = 256, 256, 3, 2, 2

    def table(k, n, widths):
        return ExpertTable.build(
            [(torch.randint(-32768, 32768, (k // 16, n // 16, w), dtype=torch.int16, generator=gen),
              torch.randn(k, generator=gen).half(), torch.randn(n, generator=gen).half(), 2) for w in widths]
        )  # fmt: skip

    w1, w3, w2 = (table(k, n, [64] * (routed + 1)) for k, n in ((d, inter), (d, inter), (inter, d)))
    x = torch.randn(tokens, d).half()
    ids, wts = torch.tensor([[0, 2], [1, 0]]), torch.rand(tokens, topk)
    moe.moe_exl3(x, ids, wts, w1, w3, w2, config=moe.MoeConfig(mma=2))
    pairs = tokens * (topk + 1)
    ((_, rargs, rkw),) = stubs["_moe_rotate_kernel"].calls
    assert rkw["PAIRS"] and rargs[5].shape == (2, pairs, 2, d) and rargs[5].dtype == torch.float16
    ((grid1, gargs, gkw),) = stubs["_moe_gate_up_kernel"].calls
    ((_, dargs, dkw),) = stubs["_moe_down_kernel"].calls
    act = gargs[18]
    assert act.shape == (pairs, 2, inter) and act.dtype == torch.float16 and dargs[5] is act
    assert grid1[1] == 4  # the groups' bound: one program a group of pairs of one expert
    assert gkw["MMA"] == dkw["MMA"] == 2 and gkw["num_warps"] == dkw["num_warps"] == 2 and gkw["BK"] == 16
    for kw, suffix in ((gkw, "1"), (gkw, "3"), (dkw, "2")):
        assert kw[f"MMA_WIDTHS{suffix}"] == (64,)  # one width: one PTX per constexpr
        assert "{v0, v2, v1, v3}" in kw[f"MMA_STEP{suffix}"][0] and len(kw[f"MMA_STORES{suffix}"]) == 2
    waves = dict(moe.MoeConfig().mma_waves)[2]
    assert gargs[27] == d // 16 and grid1[2] == moe.even_split(d // 16, grid1[0] * pairs, moe.num_sms(x.device),
                                                             waves)  # fmt: skip
    # the default: MoeConfig.mma_groups on one-width tables, mma_groups_ragged on ragged integer widths, the
    # run decode where a table holds a half rate
    moe.moe_exl3(x, ids, wts, w1, w3, w2)
    assert (
        stubs["_moe_gate_up_kernel"].calls[-1][2]["MMA"] == stubs["_moe_down_kernel"].calls[-1][2]["MMA"] == 4
    )
    ragged = table(d, inter, [64, 48, 64, 64])
    moe.moe_exl3(x, ids, wts, ragged, w3, w2)
    assert (
        stubs["_moe_gate_up_kernel"].calls[-1][2]["MMA"] == stubs["_moe_down_kernel"].calls[-1][2]["MMA"] == 2
    )
    assert stubs["_moe_gate_up_kernel"].calls[-1][2]["num_warps"] == 2
    moe.moe_exl3(x, ids, wts, table(d, inter, [64, 40, 64, 64]), w3, w2)
    assert stubs["_moe_gate_up_kernel"].calls[-1][2]["MMA"] == 0
    # asked for on a ragged table of integer widths: a branch per width, each with its own PTX
    moe.moe_exl3(x, ids, wts, ragged, w3, w2, config=moe.MoeConfig(mma=2))
    gkw = stubs["_moe_gate_up_kernel"].calls[-1][2]
    assert gkw["MMA"] == 2 and gkw["MMA_WIDTHS1"] == (48, 64) and gkw["MMA_WIDTHS3"] == (64,)
    assert gkw["MMA_STEP1"] == tuple(mma_asm(w, 2, 1, 2, wt=True)["MMA_STEP"] for w in (48, 64))
    assert len(set(gkw["MMA_STEP1"])) == 2  # the PTX differs by width
    assert gkw["MMA_LOADS1"] == sum((mma_asm(w, 2, 1, 2, wt=True)["MMA_LOADS"] for w in (48, 64)), ())
    half = table(d, inter, [64, 40, 64, 64])  # 2.5 bits: no integer width
    with pytest.raises(ValueError, match="integer widths"):
        moe.moe_exl3(x, ids, wts, half, w3, w2, config=moe.MoeConfig(mma=2))
    with pytest.raises(ValueError, match="mma groups 3"):
        moe.moe_exl3(x, ids, wts, w1, w3, w2, config=moe.MoeConfig(mma=3))


def test_byte_plan_cuts_fewer_instructions():
    """At 2 and 4 bits every state is cut by one byte permute from a few shifted window registers (11
    instructions per 8 states against 14 / 13 for shift-and-mask); other widths keep shift-and-mask."""
    from tfc.kernels.exl3.mma_ptx import byte_plan, step_ptx

    assert byte_plan(2) == (0, 2, 4, 6) and byte_plan(4) == (0, 4, 12, 16)
    assert all(byte_plan(k) is None for k in (1, 3, 5, 6, 7, 8))
    for k, before in ((2, 14), (4, 13)):
        text = step_ptx(k, 2, wt=True, rows16=False)
        cut = [
            ln for ln in text.splitlines() if ln.startswith(("prmt.b32 s", "shf.l.clamp.b32 x", "mov.b32 x"))
        ]
        shifts = sum(ln.startswith("shf.l.clamp.b32 x") for ln in cut)
        assert len(cut) == 2 * (8 + len(byte_plan(k))) and 8 + shifts // 2 == 11 < before  # two n-tiles
