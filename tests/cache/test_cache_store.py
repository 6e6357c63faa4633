"""ImageStore and `tfc cache`: ls, find, rm, prune, and holds that keep images from being removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from click.testing import CliRunner
from test_cache_helpers import random_segments, world_key_for, write_rank, write_world
from tfc.cache.errors import ImageBusy, ImageError
from tfc.cache.store import ImageStore, default_root
from tfc.cache.writer import ImageWriter

from tfc.cli import cli
from tfc.cli.cache_cmd import parse_bytes


def _three(root):
    """Three images, last used oldest -> newest: a, b, c."""
    paths = {}
    for i, tag in enumerate("abc"):
        paths[tag] = write_world(root, tag, world=1, seed=i, big=False)
        os.utime(paths[tag] / ".hold", (time.time() - 1000 + i * 100,) * 2)
    return paths


def test_default_root(monkeypatch, tmp_path):
    monkeypatch.setenv("TFC_CACHE", str(tmp_path))
    assert default_root() == tmp_path
    monkeypatch.delenv("TFC_CACHE")
    assert (
        default_root().parts[-3:]
        == (
            "tfc",
            "images",
        )
        or default_root().name == "images"
    )


def test_ls_and_find(tmp_path):
    world = write_world(tmp_path, "ls", world=2)
    wk = world_key_for("ls", 2)
    store = ImageStore(tmp_path)
    (info,) = store.ls()
    assert (info.key, info.world_key, info.world, info.ranks, info.complete, info.held) == (
        wk[:16],
        wk,
        2,
        (0, 1),
        True,
        False,
    )
    assert info.bytes == sum(f.stat().st_size for f in world.rglob("*") if f.is_file())
    assert store.find(wk) == world and store.find(wk, 1) == world / "rank1"
    assert store.find(world_key_for("other")) is None
    partial = world_key_for("partial", 2)
    write_rank(tmp_path, partial, 0, random_segments(1, big=False), world=2)
    assert not next(i for i in store.ls() if i.world_key == partial).complete


def test_held_image_never_removed(tmp_path):
    paths = _three(tmp_path)
    store = ImageStore(tmp_path)
    with store.hold(paths["a"] / "rank0") as h:
        assert h.held and next(i for i in store.ls() if i.path == paths["a"]).held
        with pytest.raises(ImageBusy, match="held"):
            store.rm(paths["a"].name)
        result = store.prune(keep=0)
        assert [i.path for i in result.held] == [paths["a"]]
        assert sorted(i.path for i in result.removed) == sorted([paths["b"], paths["c"]])
        assert (paths["a"] / "rank0" / "manifest.json").exists()
    assert store.rm(paths["a"].name[:6]) == paths["a"]
    assert not paths["a"].exists() and store.ls() == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".trash")]


def test_hold_from_another_process(tmp_path):
    paths = _three(tmp_path)
    code = textwrap.dedent(
        """
        import sys, time
        from tfc.cache.store import ImageStore
        with ImageStore(sys.argv[1]).hold(sys.argv[2]):
            print("held", flush=True)
            sys.stdin.read()
        """
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path), str(paths["b"])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert p.stdout.readline().strip() == "held"
        out = CliRunner().invoke(cli, ["cache", "--root", str(tmp_path), "prune", "--keep", "0"])
        assert out.exit_code == 0, out.output
        assert f"skipped {paths['b'].name}" in out.output and "held by a running process" in out.output
        assert paths["b"].exists() and not paths["a"].exists() and not paths["c"].exists()
    finally:
        p.stdin.close()
        p.wait(timeout=30)
    assert ImageStore(tmp_path).prune(keep=0).removed[0].path == paths["b"]


def test_prune_order_and_limits(tmp_path):
    paths = _three(tmp_path)
    store = ImageStore(tmp_path)
    sizes = {i.key: i.bytes for i in store.ls()}
    assert [i.key for i in store.ls()] == [paths[t].name for t in "cba"]  # most recently used first
    dry = store.prune(keep=1, dry_run=True)
    assert [i.path for i in dry.removed] == [paths["a"], paths["b"]] and paths["a"].exists()
    result = store.prune(max_bytes=sizes[paths["c"].name] + sizes[paths["b"].name])
    assert [i.path for i in result.removed] == [paths["a"]]
    assert store.prune(keep=1).removed[0].path == paths["b"]
    assert [i.path for i in store.ls()] == [paths["c"]]
    with pytest.raises(ImageError):
        store.prune()


def test_writer_in_progress_is_not_pruned(tmp_path):
    wk = world_key_for("building")
    with ImageWriter(tmp_path, wk, 0) as w:
        result = ImageStore(tmp_path).prune(keep=0)
        assert [i.key for i in result.held] == [wk[:16]] and w.path.exists()
        assert ImageStore(tmp_path).ls()[0].building == 1


def test_hold_after_removal_fails(tmp_path):
    paths = _three(tmp_path)
    ImageStore(tmp_path).rm(paths["c"].name)
    with pytest.raises(ImageError):
        ImageStore(tmp_path).hold(paths["c"])


def test_rm_errors(tmp_path):
    _three(tmp_path)
    store = ImageStore(tmp_path)
    with pytest.raises(ImageError, match="no image"):
        store.rm("ffff0000")
    with pytest.raises(ImageError, match="hex"):
        store.rm("../x")
    for name in ("abcd000000000000", "abcd111111111111"):
        (tmp_path / name).mkdir()
    with pytest.raises(ImageError, match="matches 2 images"):
        store.rm("abcd")


def test_cli_ls_rm_prune(tmp_path):
    paths = _three(tmp_path)
    runner = CliRunner()
    root = ["cache", "--root", str(tmp_path)]
    ls = runner.invoke(cli, [*root, "ls", "--json"])
    data = json.loads(ls.output)
    assert [i["key"] for i in data["images"]] == [paths[t].name for t in "cba"]
    assert all(i["complete"] and i["bytes"] > 0 for i in data["images"])
    table = runner.invoke(cli, [*root, "ls"])
    assert all(p.name in table.output for p in paths.values()) and "GB" in table.output
    rm = runner.invoke(cli, [*root, "rm", paths["a"].name])
    assert rm.exit_code == 0 and f"removed {paths['a']}" in rm.output
    pr = runner.invoke(cli, [*root, "prune", "--max-bytes", "1K"])
    assert pr.exit_code == 0 and "2 removed" in pr.output
    assert runner.invoke(cli, [*root, "ls"]).output.startswith("no images")


def test_parse_bytes():
    assert parse_bytes("500G") == 500 * 10**9
    assert parse_bytes("1.5TiB") == int(1.5 * 2**40)
    assert parse_bytes("123") == 123


def test_hold_creates_missing_hold_file(tmp_path):
    paths = _three(tmp_path)
    (paths["a"] / ".hold").unlink()  # e.g. an image copied without dotfiles
    store = ImageStore(tmp_path)
    with store.hold(paths["a"]), pytest.raises(ImageBusy):
        store.rm(paths["a"].name)
    with pytest.raises(ImageError):
        store.hold(tmp_path / "not-an-image")
