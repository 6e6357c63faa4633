"""`tfc load` and `tfc verify` agree on what an image is: each refuses (or accepts) a damaged one alike, in one line."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tfc.cache.format import root_digest_of
from tfc.cache.verify import verify_image
from tfc.compiler.prepare import prepare
from tfc.packs.pack import open_pack
from tfc.runtime.boot.image_open import ImageRefused, open_image


@pytest.fixture(scope="module")
def prepared(tiny_pack, tmp_path_factory) -> Path:
    """The tiny pack's TP=1 image (world folder), prepared once; tests damage copies of it."""
    return prepare(open_pack(tiny_pack), tmp_path_factory.mktemp("agree") / "store", 1, jobs=2).path


@pytest.fixture
def world(prepared, tmp_path) -> Path:
    dst = tmp_path / "store" / prepared.name
    shutil.copytree(prepared, dst, symlinks=True)
    return dst


def _rewrite(rank_dir: Path, change) -> None:
    """Apply `change` to the manifest object and sign it again, so only the change itself is wrong."""
    path = rank_dir / "manifest.json"
    obj = json.loads(path.read_text())
    change(obj)
    body = {k: v for k, v in obj.items() if k != "root_digest"}
    obj["root_digest"] = root_digest_of(body)
    path.write_text(json.dumps(obj))


def _both_refuse(path: Path, match: str) -> tuple[str, str]:
    """verify reports one problem naming `match`; load (open_image) refuses with one line naming it too."""
    report = verify_image(path, jobs=1)
    assert not report.ok
    lines = [p.line() for p in report.problems]
    assert any(match in line for line in lines), lines
    with pytest.raises(ImageRefused) as info:
        open_image(path, hold=False)
    refused = str(info.value)
    assert match in refused and "\n" not in refused, refused
    return lines[0], refused


def test_pristine_image_accepted_by_both(world):
    assert verify_image(world, jobs=1).ok
    with open_image(world, hold=False) as opened:
        assert {"keys", "layouts"} <= set(opened.checks)


def test_rank_folder_symlinked_out_of_the_store(world, tmp_path):
    outside = tmp_path / "elsewhere" / "rank0"
    outside.parent.mkdir()
    os.rename(world / "rank0", outside)
    os.symlink(outside, world / "rank0")
    _both_refuse(world, "symlink")
    _both_refuse(world / "rank0", "symlink")


def test_segment_off_its_layouts_dtype(world):
    obj = json.loads((world / "rank0" / "manifest.json").read_text())
    name = next(s["name"] for s in obj["segments"] if s["layout"] == "exl3.trellis.v1")

    def retype(obj):
        seg = next(s for s in obj["segments"] if s["name"] == name)
        seg["dtype"], seg["shape"] = "uint8", [*seg["shape"][:-1], seg["shape"][-1] * 2]  # the same bytes

    _rewrite(world / "rank0", retype)
    verify_line, load_line = _both_refuse(world, name)
    assert "int16" in verify_line and "int16" in load_line


def test_segment_of_wrong_rank_count(world):
    def flatten(obj):
        seg = next(s for s in obj["segments"] if s["layout"] == "exl3.scales.v1")
        seg["shape"] = [1, 1, *seg["shape"]]

    _rewrite(world / "rank0", flatten)
    _both_refuse(world, "dimension")


def test_image_with_no_segments(world):
    _rewrite(world / "rank0", lambda obj: obj.update(segments=[]))
    _both_refuse(world, "no segments")


def test_altered_key_inputs(world):
    _rewrite(world / "rank0", lambda obj: obj["key_inputs"].update(world=1, salt="other"))
    _both_refuse(world, "world key")


def test_unknown_layout(world):
    def relayout(obj):
        obj["segments"][0]["layout"] = "exl3.trellis.v9"

    _rewrite(world / "rank0", relayout)
    _both_refuse(world, "exl3.trellis.v9")


def test_cli_verify_and_load_refuse_alike(world):
    _rewrite(world / "rank0", lambda obj: obj.update(segments=[]))
    run = [sys.executable, "-m", "tfc"]
    verify = subprocess.run([*run, "verify", str(world)], capture_output=True, text=True, timeout=60)
    load = subprocess.run(
        [*run, "load", str(world), "--device", "cpu"], capture_output=True, text=True, timeout=60
    )
    assert verify.returncode == 1 and "no segments" in verify.stdout, verify.stdout + verify.stderr
    assert load.returncode == 2 and "no segments" in load.stderr and load.stderr.count("\n") == 1, load.stderr
