"""Engram table rows: fixture files, validation, per-rank row segments, host assets, bf16 decode and gather."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from tfc.compiler import engram_assets as ea
from tfc.compiler.engram_map import TokenMap, map_digest
from tfc.fixtures.engram_tables import write_engram_table_headers, write_engram_tables
from tfc.kernels.dsv41.engram_rows import LUT_SHA256, bf16_lut, decode_rows_reference, gather_rows_reference
from tfc.packs import deepseek_v41_contract as dsv41
from tfc.packs.engram_layout import check_layout, layer_rows, layout_from_config
from tfc.packs.safetensors_header import read_header
from tfc.runtime.models.dsv41 import engram_hash as eh

CFG = {
    "engram_layer_ids": [1, 4],
    "engram_max_ngram_size": 3,
    "engram_n_heads": 4,
    "engram_head_dim": 64,
    "engram_vocab_size": 300,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 40,
}


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    d = tmp_path_factory.mktemp("engram")
    paths = write_engram_tables(d, CFG, seed=9)
    tensors = {name: info for p in paths for name, info in read_header(p).tensors.items()}
    return d, paths, tensors


def test_fixture_files_follow_deepseek_layout(tables):
    _, paths, tensors = tables
    assert [p.name for p in paths] == ["engram-layer-01.safetensors", "engram-layer-04.safetensors"]
    rows = layer_rows(CFG)
    for layer, n in zip([1, 4], rows, strict=True):
        scale, weight = (
            tensors[f"layers.{layer}.engram.embed.scale"],
            tensors[f"layers.{layer}.engram.embed.weight"],
        )
        assert scale.offset < weight.offset  # scales first in data order, as in DeepSeek's files
        assert (weight.dtype, weight.shape, scale.dtype, scale.shape) == (
            "F8_E4M3",
            (n, 64),
            "F8_E8M0",
            (n, 2),
        )
        with open(weight.file, "rb") as f:
            f.seek(weight.offset)
            w = np.frombuffer(f.read(weight.nbytes), np.uint8)
            f.seek(scale.offset)
            s = np.frombuffer(f.read(scale.nbytes), np.uint8)
        assert (w & 0x7F).min() > 0 and (w & 0x7F).max() < 0x7F  # non-zero, never NaN
        assert s.min() >= 100 and s.max() <= 140


def test_flash_headers_are_sparse_and_real_size(tmp_path):
    flash = {
        "engram_layer_ids": [1, 14],
        "engram_max_ngram_size": 4,
        "engram_n_heads": 8,
        "engram_head_dim": 256,
        "engram_vocab_size": 16_000_000,
    }
    paths = write_engram_table_headers(tmp_path, flash)
    assert [os.stat(p).st_size for p in paths] == [
        101_377_628_616,
        101_380_404_312,
    ]  # spec/deepseek_v41.md §5
    assert all(os.stat(p).st_blocks * 512 < 1 << 20 for p in paths)
    header = read_header(paths[0])
    assert header.metadata == {"format": "pt"} and header.data_start == 264
    assert header.tensors["layers.1.engram.embed.scale"].nbytes == 3_072_049_344


def test_tp_row_segments_concatenate_to_tp1(tables):
    _, _, tensors = tables
    layout = check_layout(dict(CFG, engram_num_embeddings=layer_rows(CFG)))
    found = ea.find_tables(tensors, layout)
    (whole_1, whole_4) = [ea.read_rows(s, chunk_rows=500) for s in ea.row_segments(layout, found, 1, 0)]
    for layer_index, whole in enumerate((whole_1, whole_4)):
        t = found[layout.layer_ids[layer_index]]
        assert whole.shape == (layout.rows[layer_index], 66)
        with open(t.weight.file, "rb") as f:  # row r = its 64 weight bytes then its 2 scale bytes
            f.seek(t.weight.offset + 7 * 64)
            assert bytes(whole[7, :64]) == f.read(64)
            f.seek(t.scale.offset + 7 * 2)
            assert bytes(whole[7, 64:]) == f.read(2)
        for world in (2, 4, 8):
            parts = [
                ea.read_rows(ea.row_segments(layout, found, world, r)[layer_index], chunk_rows=333)
                for r in range(world)
            ]
            assert np.array_equal(np.concatenate(parts), whole)
    seg = ea.row_segments(layout, found, 2, 1)[0]
    got = bytearray(seg.nbytes)

    def write(off, data):
        got[off : off + len(data)] = data

    assert ea.fill_rows(seg, write, chunk_rows=97, jobs=3) == seg.nbytes
    assert bytes(got) == whole_1[seg.lo : seg.hi].tobytes()


def test_bad_tables_refused(tables, tmp_path):
    _, _, tensors = tables
    layout = check_layout(dict(CFG, engram_num_embeddings=layer_rows(CFG)))
    assert ea.find_tables({}, layout) is None
    w1 = tensors["layers.1.engram.embed.weight"]
    cases = [
        ({**tensors, w1.name: type(w1)(w1.name, "BF16", w1.shape, w1.file, w1.offset, w1.nbytes)}, "is BF16"),
        (
            {**tensors, w1.name: type(w1)(w1.name, "F8_E4M3", (5, 64), w1.file, w1.offset, 320)},
            r"\[5, 64\], expected",
        ),
        ({k: v for k, v in tensors.items() if k != w1.name}, "layers.1.engram.embed.weight is missing"),
        ({k: v for k, v in tensors.items() if ".4." not in k}, r"layers \[4\] are missing"),
    ]
    for bad, message in cases:
        with pytest.raises(ea.EngramTableError, match=message) as info:
            ea.find_tables(bad, layout)
        assert "\n" not in str(info.value)
    other = dict(CFG, engram_vocab_size=400)  # a config whose primes differ from the files
    with pytest.raises(ea.EngramTableError, match="expected F8_E4M3"):
        ea.find_tables(tensors, layout_from_config(other))


def test_table_tensors_in_dir(tables):
    d, _, tensors = tables
    assert ea.table_tensors_in_dir(d).keys() == tensors.keys()
    with pytest.raises(ea.EngramTableError, match="does not exist"):
        ea.table_tensors_in_dir(d / "nope")


def test_asset_segments_feed_the_runtime_hasher():
    layout = layout_from_config(CFG)
    ids = np.random.default_rng(2).integers(0, 40, 120).astype(np.int32)
    ids[:40] = np.arange(40)
    tm = TokenMap(ids, 40, map_digest(ids))
    segs = {s.name: s for s in ea.asset_segments(layout, tm, dict(CFG, image_token_id=119), 4, 3)}
    assert [n for n in segs if n.startswith("engram.")] == list(segs)
    assert segs[dsv41.SEG_SHARDS].data.tolist() == [[0, 2], [2, 4], [4, 6], [6, 8]]
    assert segs[dsv41.SEG_ROW_RANGES].data.tolist() == [list(layout.rank_rows(i, 4, 3)) for i in range(2)]
    assert all(s.data.dtype.byteorder in "<=|" and s.nbytes == s.data.nbytes for s in segs.values())
    t = eh.tables_from_segments(lambda n: segs[n].data)
    assert t.dead_ids == (119,) and t.pad == ids[2] and t.n_heads == 4
    rows = eh.hash_ids(t, [5, 6, 119, 7])
    assert rows.shape == (4, 2, 8) and (rows[3] >= 0).all()


def _records(rng, n, head_dim, full_range=False):
    rec = rng.integers(0, 256, size=(n, head_dim + head_dim // 32), dtype=np.uint8)
    if not full_range:
        rec[:, head_dim:] = rng.integers(100, 140, size=(n, head_dim // 32), dtype=np.uint8)
    return torch.from_numpy(rec)


def test_reference_decode_formula_and_lut():
    lut = bf16_lut()
    assert hashlib.sha256(lut.view(torch.int16).numpy().astype("<i2").tobytes()).hexdigest() == LUT_SHA256
    rng = np.random.default_rng(4)
    rec = _records(rng, 50, 64)
    got = decode_rows_reference(rec, 64).float().numpy()
    b = rec[:, :64].numpy().astype(np.int64)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp, man = (b >> 3) & 15, b & 7
    val = np.where(exp == 0, man / 8 * 2.0**-6, (1 + man / 8) * 2.0 ** (exp - 7)) * sign
    val[(b & 0x7F) == 0x7F] = np.nan
    scale = np.repeat(2.0 ** (rec[:, 64:].numpy().astype(np.int64) - 127), 32, axis=1)
    assert np.array_equal(got, val * scale, equal_nan=True)
    full = _records(rng, 256, 256, full_range=True)  # every scale byte, NaN bytes included
    idx = (full[:, 256:].long().repeat_interleave(32, 1) << 8) | full[:, :256].long()
    assert torch.equal(decode_rows_reference(full, 256).view(torch.int16), lut[idx].view(torch.int16))


def test_gather_reference_bounds():
    rec = _records(np.random.default_rng(5), 10, 64)
    rows = torch.tensor([[100, 109], [105, 100]])
    out = gather_rows_reference(rec, rows, 64, row_lo=100)
    assert out.shape == (2, 128) and torch.equal(
        out[0, 64:].view(torch.int16), decode_rows_reference(rec[9:10], 64)[0].view(torch.int16)
    )
    with pytest.raises(IndexError, match="outside the shard"):
        gather_rows_reference(rec, rows + 1, 64, row_lo=100)


_TRITON_CHECK = textwrap.dedent(
    """
    import numpy as np, torch
    from tfc.kernels.dsv41.engram_rows import gather_rows, gather_rows_reference
    rng = np.random.default_rng(6)
    for head_dim, n, t, c, full in ((64, 300, 5, 6, False), (256, 120, 3, 4, True), (64, 50, 1, 3, True)):
        rec = rng.integers(0, 256, size=(n, head_dim + head_dim // 32), dtype=np.uint8)
        if not full:
            rec[:, head_dim:] = rng.integers(100, 140, size=(n, head_dim // 32), dtype=np.uint8)
        table = torch.from_numpy(rec)
        rows = torch.from_numpy(rng.integers(1000, 1000 + n, size=(t, c)))
        got = gather_rows(table, rows, head_dim, row_lo=1000)  # 30 lookups: the last program's block is partial
        ref = gather_rows_reference(table, rows, head_dim, row_lo=1000)
        assert got.shape == ref.shape == (t, c * head_dim), got.shape
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16)), head_dim
    print("ok")
    """
)


def test_triton_gather_equals_reference():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(
        [sys.executable, "-c", _TRITON_CHECK], env=env, capture_output=True, text=True, timeout=240
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]
