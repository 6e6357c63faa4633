"""Engram tables stored as holes (sparse files) stay holes through `tfc prepare`: rows are skipped, not read, the
image's rows take no disk, and their digests are those of the zeros they read as."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from tfc.cache.digest import segment_digest
from tfc.cache.format import RankManifest
from tfc.cache.reader import open_rank
from tfc.cache.verify import verify_image
from tfc.compiler import engram_assets as ea
from tfc.compiler.prepare import prepare
from tfc.compiler.segments import Zeros
from tfc.fixtures.engram_tables import write_engram_table_headers
from tfc.packs.engram_layout import layer_rows, layout_from_config
from tfc.packs.pack import open_pack


@pytest.fixture(scope="module")
def sparse_pack(tiny_pack, tmp_path_factory):
    """The tiny pack with Engram tables of ~2.4 M rows a layer written as holes (~160 MB apparent each)."""
    out = tmp_path_factory.mktemp("sparse") / "pack"
    shutil.copytree(tiny_pack, out)
    raw = json.loads((out / "config.json").read_text())
    text = raw["text_config"]
    text["engram_vocab_size"] = 200_000
    text["engram_num_embeddings"] = layer_rows(text)
    (out / "config.json").write_text(json.dumps(raw, indent=2, ensure_ascii=False))
    write_engram_table_headers(out, text)
    return out


def _row_segments(pack, world=1, rank=0):
    layout = layout_from_config(pack.config)
    tables = ea.find_tables(pack.tensors, layout)
    return ea.row_segments(layout, tables, world, rank)


def test_hole_chunks_come_as_zeros_and_dense_ones_as_rows(sparse_pack, tiny_pack):
    seg = _row_segments(open_pack(sparse_pack))[0]
    chunks = list(ea.iter_rows(seg, chunk_rows=100_000, holes=True))
    zeros = [c for _, c in chunks if isinstance(c, Zeros)]
    assert len(zeros) >= len(chunks) - 1 >= 20  # the first chunk shares a page with the file's header
    assert ea.hole_bytes(seg, chunk_rows=100_000) == sum(z.nbytes for z in zeros)
    out = np.full(seg.nbytes, 7, np.uint8)

    def write(offset, data):
        out[offset : offset + len(data)] = np.frombuffer(data, np.uint8)

    def zero(offset, nbytes):
        out[offset : offset + nbytes] = 0

    assert ea.fill_rows(seg, write, chunk_rows=100_000, zeros=zero) == seg.nbytes
    assert not out.any()
    dense = _row_segments(open_pack(tiny_pack))[0]  # random rows: nothing is a hole
    assert ea.hole_bytes(dense, chunk_rows=97) == 0
    assert not any(isinstance(c, Zeros) for _, c in ea.iter_rows(dense, chunk_rows=97, holes=True))


@pytest.mark.parametrize("world", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_prepared_rows_of_a_sparse_pack_take_no_disk(sparse_pack, tmp_path, world):
    pack = open_pack(sparse_pack)
    result = prepare(pack, tmp_path, world, jobs=2)
    for rank in range(world):
        path = result.path / f"rank{rank}"
        m = RankManifest.load(path)
        for seg in _row_segments(pack, world, rank):
            entry = m.segment_map[seg.name]
            assert entry.length == seg.nbytes > 50 << 20
            assert entry.digest == segment_digest(np.zeros(seg.nbytes, np.uint8)).digest
        st = os.stat(
            path / "L01.bin"
        )  # the rows' first 64 MiB read is dense: it holds the file's header page
        assert st.st_blocks * 512 < st.st_size // 4
        image = open_rank(path)
        assert not np.frombuffer(image.segment(seg.name), np.uint8)[-(1 << 20) :].any()
        image.close()
        assert verify_image(path, mode="sample").ok
