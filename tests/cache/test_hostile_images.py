"""Hostile images (pipes, deep manifests, linked or empty ranks): refused in a line, never breaking `cache ls`."""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path

import pytest
from support.hang import within as _within
from test_cache_helpers import random_segments, world_key_for, write_rank, write_world
from tfc.cache.errors import ImageError
from tfc.cache.files import open_read, open_regular
from tfc.cache.format import RankManifest, root_digest_of
from tfc.cache.locks import HOLD_NAME, ImageHold
from tfc.cache.manifest_parse import MAX_DEPTH, manifest_from_bytes
from tfc.cache.store import ImageStore


def _nested(rank_dir: Path, depth: int) -> bytes:
    """The rank's manifest with meta.deep nested `depth` levels below the manifest's own object, re-signed."""
    obj = json.loads((rank_dir / "manifest.json").read_text())
    obj["meta"]["deep"] = _nested_value(depth)
    body = {k: v for k, v in obj.items() if k != "root_digest"}
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(limit + 4 * depth)  # the test writes deeper JSON than tfc reads back
    try:
        obj["root_digest"] = root_digest_of(body)
        return json.dumps(obj).encode()
    finally:
        sys.setrecursionlimit(limit)


def _nested_value(depth: int) -> list:
    deep: list = []
    for _ in range(depth - 3):  # the manifest is level 1, meta 2, meta.deep's outermost list 3
        deep = [deep]
    return deep


def test_open_read_refuses_what_is_not_regular(tmp_path):
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(tmp_path / "sock"))
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "sock")
    try:
        for path, why in (
            (fifo, "a named pipe, not a regular file"),
            (Path("/dev/null"), "a character device, not a regular file"),
            (tmp_path / "sock", "a socket, not a regular file"),
            (tmp_path, "a directory, not a regular file"),
            (link, "a symlink (refused)"),
        ):
            with pytest.raises(OSError, match=re.escape(why)):
                _within(10, open_read, path)
            with pytest.raises(ImageError, match=re.escape(f"{path}: manifest is {why}")):
                _within(10, open_regular, path, "manifest", "missing")
    finally:
        s.close()


def test_depth_bound(tmp_path):
    path = write_rank(tmp_path, world_key_for("deep"), 0, random_segments(1, big=False))
    assert RankManifest.from_bytes(_nested(path, MAX_DEPTH)).meta["deep"] == _nested_value(MAX_DEPTH)
    with pytest.raises(ImageError, match=f"meta is nested more than {MAX_DEPTH} levels deep"):
        manifest_from_bytes(_nested(path, MAX_DEPTH + 1))
    with pytest.raises(ImageError, match=f"nested more than {MAX_DEPTH} levels deep"):
        manifest_from_bytes(_nested(path, 980))  # parsed or not, depending on the stack it is read from
    text = (path / "manifest.json").read_text()
    deep = text[:-2] + ',"x":' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(ImageError, match=f"nested more than {MAX_DEPTH} levels deep"):
        manifest_from_bytes(deep.encode())


def test_one_bad_image_never_breaks_ls(tmp_path):
    good = write_world(tmp_path, "good", world=1)
    bad = {}
    for tag in ("pipe", "deep", "link", "empty"):
        bad[tag] = write_world(tmp_path, tag, world=1, big=False)
    os.unlink(bad["pipe"] / "rank0" / "manifest.json")
    os.mkfifo(bad["pipe"] / "rank0" / "manifest.json")
    (bad["deep"] / "rank0" / "manifest.json").write_bytes(_nested(bad["deep"] / "rank0", 500))
    outside = tmp_path / "outside"
    os.rename(bad["link"] / "rank0", outside)
    os.symlink(outside, bad["link"] / "rank0")
    obj = json.loads((bad["empty"] / "rank0" / "manifest.json").read_text())
    obj["segments"] = []
    body = {k: v for k, v in obj.items() if k != "root_digest"}
    obj["root_digest"] = root_digest_of(body)
    (bad["empty"] / "rank0" / "manifest.json").write_text(json.dumps(obj))
    store = ImageStore(tmp_path)
    infos = {i.path: i for i in _within(30, store.ls)}
    assert infos[good].complete and infos[good].error is None and infos[good].ranks == (0,)
    reasons = {"pipe": "named pipe", "deep": "nested more than", "link": "symlink", "empty": "no segments"}
    for tag, folder in bad.items():
        info = infos[folder]
        assert info.ranks == () and not info.complete and reasons[tag] in info.error, (tag, info.error)
        assert "\n" not in info.error
    json.dumps([i.to_dict() for i in infos.values()])  # what `cache ls --json` prints
    wk = world_key_for("link", 1)
    assert store.find(wk) is None  # prepare would rebuild it, not reuse a rank folder load refuses


def test_hold_file_that_is_a_pipe(tmp_path):
    world = write_world(tmp_path, "hold", world=1, big=False)
    os.unlink(world / HOLD_NAME)
    os.mkfifo(world / HOLD_NAME)
    with pytest.raises(ImageError, match="named pipe"):
        _within(10, ImageHold, world)
    info = _within(30, ImageStore(tmp_path).ls)[0]
    assert info.complete and not info.held


def test_publish_never_takes_a_linked_rank_folder(tmp_path):
    wk = world_key_for("publish")
    rank0 = write_rank(tmp_path, wk, 0, random_segments(2, big=False))
    outside = tmp_path / "outside"
    os.rename(rank0, outside)
    os.symlink(outside, rank0)  # the same image, linked in: `find` skips it, so prepare writes again
    assert ImageStore(tmp_path).find(wk) is None
    with pytest.raises(ImageError, match="symlink"):
        write_rank(tmp_path, wk, 0, random_segments(2, big=False))
    assert rank0.is_symlink() and not [p for p in rank0.parent.iterdir() if p.name.startswith(".tmp-")]


def test_lock_file_that_is_a_pipe(tmp_path):
    wk = world_key_for("lock")
    (tmp_path / wk[:16]).mkdir()
    os.mkfifo(tmp_path / wk[:16] / ".lock")
    with pytest.raises(ImageError, match=r"\.lock: cannot lock the image folder: a named pipe"):
        _within(10, write_rank, tmp_path, wk, 0, random_segments(2, big=False))
