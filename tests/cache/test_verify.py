"""`verify_image` and `tfc verify`: every damaged, truncated or missing segment and file is named."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner
from test_cache_helpers import CHUNK, write_world
from tfc.cache.errors import ImageError
from tfc.cache.format import RankManifest
from tfc.cache.verify import sample_chunks, verify_image

from tfc.cli import cli

BIG = "layers.0.ffn.experts.w1.trellis"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    return write_world(root, "verify", world=2)


@pytest.fixture
def image(pristine, tmp_path):
    dst = tmp_path / pristine.name
    shutil.copytree(pristine, dst)
    return dst


def _flip(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def _kinds(report):
    return sorted((p.kind, p.rank, p.file, p.segment) for p in report.problems)


def test_clean_image_full_and_sample(image):
    full = verify_image(image, "full", jobs=2)
    assert full.ok and full.ranks == [0, 1] and full.segments == 10
    assert full.bytes_checked == sum(
        RankManifest.load(image / f"rank{r}").total_bytes for r in (0, 1)
    ) - _padding(image)
    sample = verify_image(image, "sample")
    assert sample.ok and sample.bytes_checked < full.bytes_checked
    assert verify_image(image / "rank1").ranks == [1]


def _padding(image):
    total = 0
    for r in (0, 1):
        m = RankManifest.load(image / f"rank{r}")
        total += m.total_bytes - sum(s.length for s in m.segments)
    return total


def test_flipped_byte_named(image):
    m = RankManifest.load(image / "rank1")
    seg = m.segment_map[BIG]
    _flip(image / "rank1" / seg.file, seg.offset + 2 * CHUNK + 5)  # chunk 2 of 4: not sampled
    small = m.segment_map["layers.0.norm"]
    _flip(image / "rank1" / small.file, small.offset + 17)
    report = verify_image(image, "full")
    assert _kinds(report) == [("damaged", 1, seg.file, BIG), ("damaged", 1, small.file, "layers.0.norm")]
    assert f"first at byte {2 * CHUNK}" in next(p.detail for p in report.problems if p.segment == BIG)
    assert _kinds(verify_image(image, "sample")) == [("damaged", 1, small.file, "layers.0.norm")]
    _flip(image / "rank1" / seg.file, seg.offset + 3 * CHUNK + 1)  # the last chunk: sampled
    assert len(verify_image(image, "sample").problems) == 2


def test_truncation_named(image):
    m = RankManifest.load(image / "rank0")
    seg = m.segment_map[BIG]
    os.truncate(image / "rank0" / seg.file, seg.offset + CHUNK)
    after = [s.name for s in m.segments if s.file == seg.file and s.offset + s.length > seg.offset + CHUNK]
    report = verify_image(image)
    assert ("file_size", 0, seg.file, None) in _kinds(report)
    assert sorted(p.segment for p in report.problems if p.kind == "truncated") == sorted(after)
    assert BIG in after


def test_deleted_file_and_rank_named(image):
    m = RankManifest.load(image / "rank0")
    os.unlink(image / "rank0" / "data1.bin")
    in_file = sorted(s.name for s in m.segments if s.file == "data1.bin")
    shutil.rmtree(image / "rank1")
    report = verify_image(image)
    kinds = _kinds(report)
    assert ("missing_file", 0, "data1.bin", None) in kinds
    assert sorted(s for k, _, _, s in kinds if k == "missing") == in_file
    assert ("missing_rank", 1, None, None) in kinds


def test_damaged_manifest_named(image):
    mf = image / "rank1" / "manifest.json"
    mf.write_bytes(mf.read_bytes().replace(b'"world":2', b'"world":3'))
    report = verify_image(image)
    assert [(p.kind, p.rank) for p in report.problems] == [("manifest", 1)]
    assert "root digest" in report.problems[0].detail


def test_not_an_image(tmp_path):
    with pytest.raises(ImageError):
        verify_image(tmp_path)
    with pytest.raises(ImageError):
        verify_image(tmp_path / "nope")


def test_sample_rule():
    assert sample_chunks(1) == [0]
    assert sample_chunks(2) == [0, 1]
    assert sample_chunks(40) == [0, 16, 32, 39]


def test_cli_exit_codes_and_lines(image):
    runner = CliRunner()
    ok = runner.invoke(cli, ["verify", str(image)])
    assert ok.exit_code == 0 and ok.output.startswith("ok:"), ok.output
    m = RankManifest.load(image / "rank0")
    seg = m.segment_map["layers.0.attn.wq_b.suh"]
    _flip(image / "rank0" / seg.file, seg.offset)
    os.unlink(image / "rank1" / "data0.bin")
    bad = runner.invoke(cli, ["verify", "--sample", "--jobs", "1", str(image)])
    assert bad.exit_code == 1
    lines = bad.output.splitlines()
    assert any(line.startswith("DAMAGED rank0") and "layers.0.attn.wq_b.suh" in line for line in lines)
    assert any(line.startswith("MISSING FILE rank1 data0.bin") for line in lines)
    missing = [s.name for s in RankManifest.load(image / "rank1").segments if s.file == "data0.bin"]
    for name in missing:
        assert any(line.startswith("MISSING rank1 data0.bin") and name in line for line in lines)
    js = runner.invoke(cli, ["verify", "--json", str(image)])
    assert js.exit_code == 1
    report = json.loads(js.output)
    assert not report["ok"] and {p["kind"] for p in report["problems"]} == {
        "damaged",
        "missing_file",
        "missing",
    }


def test_cli_process_exit_codes(image, tmp_path):
    run = [sys.executable, "-m", "tfc", "verify"]
    os.truncate(image / "rank0" / "data0.bin", 4096)
    r = subprocess.run([*run, str(image)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "TRUNCATED rank0 data0.bin" in r.stdout
    r = subprocess.run([*run, str(tmp_path / "nothing")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("tfc: error:") and "Traceback" not in r.stderr


def test_symlinked_or_replaced_file_named(image, tmp_path):
    target = tmp_path / "outside.bin"
    os.rename(image / "rank0" / "data0.bin", target)
    os.symlink(target, image / "rank0" / "data0.bin")
    shutil.rmtree(image / "rank1")
    (image / "rank1").mkdir()
    report = verify_image(image)
    kinds = _kinds(report)
    assert ("unreadable", 0, "data0.bin", None) in kinds and "symlink" in report.problems[0].detail
    names = [s.name for s in RankManifest.load(image / "rank0").segments if s.file == "data0.bin"]
    assert sorted(s for k, r, _, s in kinds if k == "missing" and r == 0) == sorted(names)
    assert ("manifest", 1, None, None) in kinds
