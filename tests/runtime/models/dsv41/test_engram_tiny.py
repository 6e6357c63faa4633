"""Engram on the tiny pack: its map size equals its config, prepared row segments concatenate across TP."""

from __future__ import annotations

import contextlib
import json

import numpy as np
import pytest
import torch
from tfc.cache.reader import open_rank
from tfc.compiler import engram_assets as ea
from tfc.compiler.engram_map import build_token_map, check_token_map
from tfc.compiler.prepare import prepare
from tfc.kernels.dsv41.engram_rows import decode_rows_reference, gather_rows_reference
from tfc.packs import deepseek_v41_contract as dsv41
from tfc.packs.engram_layout import check_layout
from tfc.packs.pack import open_pack
from tfc.runtime.models.dsv41 import engram_hash as eh


@pytest.fixture(scope="module")
def tiny(tiny_pack):
    return open_pack(tiny_pack)


@pytest.fixture(scope="module")
def images(tiny, tmp_path_factory):
    root = tmp_path_factory.mktemp("engram_images")
    out = {}
    for world in (1, 2, 4):
        result = prepare(tiny, root, world, jobs=2)
        out[world] = [open_rank(result.path / f"rank{r}") for r in range(world)]
    yield out
    for ranks in out.values():
        for image in ranks:
            with contextlib.suppress(BufferError):
                image.close()


def _array(image, name):
    entry = image.entry(name)
    return np.frombuffer(image.segment(name), dtype=np.dtype(entry.dtype).newbyteorder("<")).reshape(
        entry.shape
    )


def test_tiny_map_matches_its_config(tiny):
    tm = build_token_map(tiny.tokenizer_path)
    check_token_map(tm, tiny.config, tiny.tokenizer_path)
    assert tm.size == tiny.config.engram_compressed_vocab_size == 539
    layout = check_layout(tiny.config)
    assert ea.find_tables(tiny.tensors, layout).keys() == {1, 2}


def test_prepared_rows_concatenate_across_tp(tiny, images):
    layout = check_layout(tiny.config)
    tables = ea.find_tables(tiny.tensors, layout)
    for layer in layout.layer_ids:
        name = dsv41.engram_rows_name(layer)
        whole = _array(images[1][0], name)
        assert np.array_equal(
            whole, ea.read_rows(ea.row_segments(layout, tables, 1, 0)[layout.layer_ids.index(layer)])
        )
        for world in (2, 4):
            parts = [_array(img, name) for img in images[world]]
            assert np.array_equal(np.concatenate(parts), whole)
            for r, img in enumerate(images[world]):
                ranges = _array(img, dsv41.SEG_ROW_RANGES)
                lo, hi = ranges[layout.layer_ids.index(layer)]
                assert hi - lo == parts[r].shape[0]


def test_image_hash_and_gather_equal_the_pack(tiny, images):
    layout = check_layout(tiny.config)
    tm = build_token_map(tiny.tokenizer_path)
    img = images[2][1]
    tables = eh.tables_from_segments(lambda n: _array(img, n))
    ids = np.random.default_rng(8).integers(0, len(tm), 64)
    ids[10] = tiny.config.image_token_id
    rows = eh.hash_ids(tables, ids)
    direct = eh.HashTables(
        tm.ids,
        _array(img, dsv41.SEG_MULTIPLIERS),
        layout.primes_array(),
        layout.offsets_array(),
        tiny.config.engram_pad_token_id,
        (tiny.config.image_token_id,),
    )
    assert np.array_equal(rows, eh.hash_ids(direct, ids))
    # rank 1's columns gathered from its own shard equal the TP=1 shard's decode of the same rows
    cols = layout.rank_columns(2, 1)
    for i, layer in enumerate(layout.layer_ids):
        lo, _ = _array(img, dsv41.SEG_ROW_RANGES)[i]
        shard = torch.from_numpy(_array(img, dsv41.engram_rows_name(layer)).copy())
        got = gather_rows_reference(
            shard, torch.from_numpy(rows[:, i, cols.start : cols.stop]), layout.head_dim, lo
        )
        full = torch.from_numpy(_array(images[1][0], dsv41.engram_rows_name(layer)).copy())
        want = decode_rows_reference(
            full[torch.from_numpy(rows[:, i, cols.start : cols.stop]).reshape(-1)], 64
        )
        assert torch.equal(got.view(torch.int16), want.reshape(got.shape).view(torch.int16))


def test_cli_on_tiny_pack_and_image(tiny_pack, images):
    from test_engram_cli import run_tfc

    a = run_tfc("engram", str(tiny_pack), "--text", "hello world", "--json")
    assert a.returncode == 0, a.stderr
    report = json.loads(a.stdout)
    assert report["compressed_vocab"] == 539 and report["layers"] == [1, 2] and report["columns"] == 12
    ids = ",".join(map(str, report["ids"]))
    b = run_tfc("engram", str(images[4][3].path), "--ids", ids, "--json")
    assert b.returncode == 0, b.stderr
    assert json.loads(b.stdout)["rows"] == report["rows"]


def test_bad_engram_dir_one_line_exit_2(tmp_path, tiny):
    from test_engram_cli import run_tfc
    from tfc.fixtures.engram_tables import _header, table_file_name

    rows = check_layout(tiny.config).rows[0]
    header = _header(1, rows, 64).replace(b'"F8_E8M0"', b'"U8"     ')  # same length: scale stored as U8
    (tmp_path / "tables").mkdir()
    with open(tmp_path / "tables" / table_file_name(1), "wb") as f:
        f.write(header)
        f.truncate(len(header) + rows * 66)
    out = run_tfc(
        "prepare",
        str(tiny.root),
        "-o",
        str(tmp_path / "img"),
        "--tp",
        "2",
        "--engram-dir",
        str(tmp_path / "tables"),
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "layers.1.engram.embed.scale is U8 [" in out.stderr and "expected F8_E8M0" in out.stderr
