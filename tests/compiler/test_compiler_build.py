"""The build primitives: 128-block partitions, copy splitting, covering reads, strided extraction."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tfc.compiler.build import Op, coalesce, extract, run_reads, split_copy
from tfc.compiler.convert import bf16_bits_to_f32, convert_elements, f32_to_bf16_bits
from tfc.compiler.errors import PlanError
from tfc.compiler.segments import Copy
from tfc.compiler.splits import block_parts, even_parts


def test_block_parts_lower_ranks_take_one_more():
    parts = block_parts(2304, 4, "w1")
    assert [p.size for p in parts] == [640, 640, 512, 512]
    assert parts[0].start == 0 and parts[-1].stop == 2304
    assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
    vocab = block_parts(129280, 4, "head")
    assert [p.size for p in vocab] == [32384, 32384, 32256, 32256]
    assert [p.size for p in block_parts(129280, 2, "head")] == [64640, 64640]


def test_block_parts_refuses_cut_blocks_and_empty_ranks():
    with pytest.raises(PlanError, match="w2"):
        block_parts(200, 2, "w2")
    with pytest.raises(PlanError, match=r"indexer\.wk"):
        block_parts(128, 2, "indexer.wk")
    with pytest.raises(PlanError):
        even_parts(64, 3, 1, "heads")


def _random_file(tmp_path, size, seed=0):
    data = np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)
    path = tmp_path / "src.bin"
    path.write_bytes(data.tobytes())
    return path, data


def test_split_copy_rows_and_runs_reassemble(tmp_path):
    path, data = _random_file(tmp_path, 1 << 16)
    strided = Copy(path, 100, 48, rows=200, stride=300, dst=7)
    pieces = split_copy(strided, limit=1000)
    assert len(pieces) > 1 and all(p.span <= 1000 for p in pieces)
    assert sum(p.rows for p in pieces) == 200
    contiguous = Copy(path, 5, 50_000, dst=3)
    parts = split_copy(contiguous, limit=4096)
    assert sum(p.run for p in parts) == 50_000 and all(p.span <= 4096 for p in parts)
    for copy, cut in ((strided, pieces), (contiguous, parts)):
        whole = extract(data, 0, copy)
        out = np.full(copy.dst + whole.nbytes, 0xAA, np.uint8)
        for piece in cut:
            got = extract(data, 0, piece)
            out[piece.dst : piece.dst + got.nbytes] = got
        assert np.array_equal(out[copy.dst :], whole)


def test_extract_strided_matches_numpy_slicing(tmp_path):
    path, data = _random_file(tmp_path, 64 * 9 * 20)
    tiles = data.reshape(20, 9, 64)  # [tk, tn, tile bytes]
    copy = Copy(path, 3 * 64, 4 * 64, rows=20, stride=9 * 64)
    assert np.array_equal(extract(data, 0, copy), tiles[:, 3:7, :].reshape(-1))


def test_coalesce_covers_each_source_byte_once(tmp_path):
    path, _ = _random_file(tmp_path, 1 << 12)
    ops = [Op(Copy(path, 0, 64), 0), Op(Copy(path, 64, 64), 1), Op(Copy(path, 4000, 16), 2)]
    reads = coalesce(ops)
    assert len(reads) == 1 and len(reads[0]) == 3


def test_run_reads_writes_every_op(tmp_path):
    path, data = _random_file(tmp_path, 1 << 15)
    rng = np.random.default_rng(1)
    ops, expected = [], {}
    for sink in range(30):
        src, run = int(rng.integers(0, 1 << 14)), int(rng.integers(1, 2048))
        ops.append(Op(Copy(path, src, run), sink))
        expected[sink] = data[src : src + run]
    got = {}
    run_reads(ops, lambda sink, dst, d: got.__setitem__(sink, d.copy()), jobs=4)
    assert all(np.array_equal(got[s], expected[s]) for s in expected)


def test_bf16_rounding_nearest_even():
    values = np.random.default_rng(2).standard_normal(10_000).astype(np.float32)
    bits = f32_to_bf16_bits(values)
    back = bf16_bits_to_f32(bits)
    # reference: exact rounding computed in float64 on the two bf16 neighbours
    lo = (values.view(np.uint32) & 0xFFFF0000).view(np.float32)
    hi = ((values.view(np.uint32) & 0xFFFF0000) + 0x10000).view(np.float32)
    dlo, dhi = np.abs(values.astype(np.float64) - lo), np.abs(hi.astype(np.float64) - values)
    want = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where((lo.view(np.uint32) >> 16) & 1, hi, lo)))
    assert np.array_equal(back, want)


def test_convert_f16_to_f32_and_bf16():
    values = np.random.default_rng(3).standard_normal(257).astype(np.float16)
    raw = values.view(np.uint8)
    assert np.array_equal(convert_elements(raw, "F16", "float32").view(np.float32), values.astype(np.float32))
    bf = convert_elements(raw, "F16", "bfloat16").view(np.uint16)
    assert np.array_equal(bf, f32_to_bf16_bits(values.astype(np.float32)))
