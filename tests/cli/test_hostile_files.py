"""Pipes, devices and deep JSON where tfc expects a file: one line naming it and a non-zero exit, never a hang."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tfc.cache.format import root_digest_of
from tfc.compiler.prepare import prepare
from tfc.packs.pack import open_pack

TIMEOUT = 60  # a regression hangs on a pipe: the subprocess is killed and the test fails instead


def _tfc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tfc", *args], capture_output=True, text=True, timeout=TIMEOUT
    )


def _pipe(path: Path) -> Path:
    path.unlink()
    os.mkfifo(path)
    return path


def _one_line(r: subprocess.CompletedProcess, code: int, *words: str) -> str:
    err = r.stderr
    assert r.returncode == code, (r.returncode, r.stdout, err)
    assert err.startswith("tfc: error:") and err.count("\n") == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    return err


@pytest.fixture(scope="module")
def prepared(tiny_pack, tmp_path_factory) -> Path:
    return prepare(open_pack(tiny_pack), tmp_path_factory.mktemp("hostile") / "store", 1, jobs=2).path


@pytest.fixture
def world(prepared, tmp_path) -> Path:
    dst = tmp_path / "store" / prepared.name
    shutil.copytree(prepared, dst)
    return dst


@pytest.fixture
def pack(tiny_pack, tmp_path) -> Path:
    dst = tmp_path / "pack"
    shutil.copytree(tiny_pack, dst)
    return dst


def test_pipe_as_manifest(world):
    mf = _pipe(world / "rank0" / "manifest.json")
    r = _tfc("verify", str(world))
    assert r.returncode == 1 and "manifest.json: manifest is a named pipe" in r.stdout, r.stdout + r.stderr
    _one_line(_tfc("inspect", str(world)), 2, str(mf), "named pipe")
    _one_line(_tfc("load", str(world), "--device", "cpu"), 2, str(mf), "named pipe")


def test_pipe_as_data_file(world):
    data = _pipe(world / "rank0" / "L00.bin")
    r = _tfc("verify", str(world))
    assert r.returncode == 1 and "UNREADABLE rank0 L00.bin: data file is a named pipe" in r.stdout, r.stdout
    _one_line(_tfc("load", str(world), "--device", "cpu"), 2, str(data), "named pipe")


def test_pipe_as_lock_files_and_cache_ls(world):
    bad = world.parent / ("f" * 16)
    shutil.copytree(world, bad)
    _pipe(bad / "rank0" / "manifest.json")
    _pipe(world / ".hold")
    r = _tfc("cache", "--root", str(world.parent), "ls", "--json")
    assert r.returncode == 0, r.stderr
    images = {i["key"]: i for i in json.loads(r.stdout)["images"]}
    assert images[world.name]["complete"] and images[world.name]["error"] is None
    assert images[bad.name]["ranks"] == [] and "named pipe" in images[bad.name]["error"]
    assert _tfc("load", str(world), "--device", "cpu").returncode == 0  # a pipe for .hold: not held, loaded


@pytest.mark.parametrize(
    "name",
    ["config.json", "model.safetensors.index.json", "model-00002-of-00005.safetensors", "tokenizer.json"],
)
def test_pipe_in_pack(pack, name):
    path = _pipe(pack / name)
    _one_line(_tfc("inspect", str(pack)), 2, str(path), "named pipe, not a regular file")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors.index.json", "tokenizer.json"])
def test_device_in_pack(pack, name):
    (pack / name).unlink()
    os.symlink("/dev/zero", pack / name)  # endless bytes: reading it whole would never end
    _one_line(_tfc("inspect", str(pack)), 2, name, "character device")
    _one_line(_tfc("prepare", str(pack), "-o", str(pack.parent / "s")), 2, name, "character device")


def _deep_meta(rank_dir: Path, depth: int) -> None:
    """Nest a list `depth` levels deep in meta; under 2000 levels its root digest matches (computed past the
    recursion limit), so only the depth is wrong."""
    path = rank_dir / "manifest.json"
    obj = json.loads(path.read_text())
    body = {k: v for k, v in obj.items() if k != "root_digest"}
    body["meta"]["deep"] = "DEEP"
    text = json.dumps(body, sort_keys=True, separators=(",", ":")).replace(
        '"DEEP"', "[" * depth + "]" * depth
    )
    digest = "0" * 64
    if depth < 2000:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + 4 * depth)
        try:
            digest = root_digest_of(json.loads(text))
        finally:
            sys.setrecursionlimit(limit)
    path.write_text(text[:-1] + f',"root_digest":"{digest}"}}')


@pytest.mark.parametrize("depth", [980, 100_000])  # just under Python's parse limit, and far past it
def test_deep_manifest(world, depth):
    bad = world.parent / ("e" * 16)
    shutil.copytree(world, bad)
    _deep_meta(bad / "rank0", depth)
    r = _tfc("verify", str(bad))
    assert r.returncode == 1 and "nested more than 64 levels deep" in r.stdout, r.stdout + r.stderr
    _one_line(_tfc("inspect", str(bad), "--json"), 2, "nested more than 64 levels deep")
    _one_line(_tfc("load", str(bad), "--device", "cpu"), 2, "nested more than 64 levels deep")
    r = _tfc("cache", "--root", str(world.parent), "ls", "--json")
    assert r.returncode == 0, r.stderr
    images = {i["key"]: i for i in json.loads(r.stdout)["images"]}
    assert images[world.name]["complete"] and "nested more than 64" in images[bad.name]["error"]
