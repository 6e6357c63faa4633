"""Prepare: keys that move with the loader and the pack, cache hits, atomic publication under kills and races."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tfc.cache.verify import verify_image
from tfc.compiler import prepare as prep
from tfc.compiler.errors import BuildError
from tfc.compiler.identity import SAMPLE_BLOCK, pack_identity, sample_offsets
from tfc.packs.pack import open_pack


def _tfc(*args, **kw):
    return subprocess.run(
        [sys.executable, "-m", "tfc", *args], capture_output=True, text=True, timeout=120, **kw
    )


@pytest.fixture()
def pack_copy(tiny_pack, tmp_path):
    out = tmp_path / "pack"
    shutil.copytree(tiny_pack, out)
    return out


def test_loader_source_byte_changes_key(tmp_path):
    sources = prep.loader_sources()
    copies = []
    for src in sources:
        dst = tmp_path / src.parent.name / src.name
        dst.parent.mkdir(exist_ok=True)
        dst.write_bytes(src.read_bytes())
        copies.append(dst)
    before = prep.loader_hash(copies)
    assert before == prep.loader_hash(list(reversed(copies)))
    target = next(p for p in copies if p.name == "dsv41_plan.py")
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    assert prep.loader_hash(copies) != before


def test_sampled_block_changes_identity_and_strict_catches_any_byte(pack_copy):
    pack = open_pack(pack_copy)
    shard = max(pack.shards, key=lambda p: p.stat().st_size)
    sampled, strict = pack_identity(pack.shards, []), pack_identity(pack.shards, [], strict=True)
    header_end = 8 + int.from_bytes(shard.read_bytes()[:8], "little")
    offsets = sample_offsets(header_end, shard.stat().st_size)
    # a byte outside every sampled block: sampled identity keeps, strict identity moves
    outside = next(
        o
        for o in range(header_end, shard.stat().st_size)
        if all(not s <= o < s + SAMPLE_BLOCK for s in offsets)
    )
    with open(shard, "r+b") as f:
        f.seek(outside)
        byte = f.read(1)
        f.seek(outside)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert pack_identity(pack.shards, []) == sampled
    assert pack_identity(pack.shards, [], strict=True) != strict
    with open(shard, "r+b") as f:
        f.seek(offsets[1] + 7)
        byte = f.read(1)
        f.seek(offsets[1] + 7)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert pack_identity(pack.shards, []) != sampled


def test_prepare_hit_reads_no_payload_and_builds_once(pack_copy, tmp_path, monkeypatch):
    pack = open_pack(pack_copy)
    first = prep.prepare(pack, tmp_path / "store", 2, jobs=2)
    assert first.ranks == {0: "built", 1: "built"}
    assert verify_image(first.path).ok
    monkeypatch.setattr(prep, "run_reads", lambda *a, **k: pytest.fail("a cache hit must not read payload"))
    again = prep.prepare(pack, tmp_path / "store", 2, jobs=2)
    assert again.ranks == {0: "hit", 1: "hit"} and again.path == first.path
    assert again.seconds < 1.0


def test_changed_pack_during_prepare_publishes_nothing(pack_copy, tmp_path, monkeypatch):
    pack = open_pack(pack_copy)
    shard = max(pack.shards, key=lambda p: p.stat().st_size)
    real = prep.run_reads

    def reads_then_change(*args, **kwargs):
        real(*args, **kwargs)
        with open(shard, "ab") as f:
            f.write(b"\0" * 16)

    monkeypatch.setattr(prep, "run_reads", reads_then_change)
    with pytest.raises(BuildError, match="changed"):
        prep.prepare(pack, tmp_path / "store", 1, jobs=2)
    assert not list((tmp_path / "store").glob("*/rank*/manifest.json"))


def test_force_rebuilds_and_refuses_a_held_image(pack_copy, tmp_path):
    from tfc.cache.errors import ImageBusy
    from tfc.cache.store import ImageStore

    pack = open_pack(pack_copy)
    first = prep.prepare(pack, tmp_path / "store", 1, jobs=2)
    again = prep.prepare(pack, tmp_path / "store", 1, jobs=2, force=True)
    assert again.ranks == {0: "built"} and verify_image(again.path).ok
    with ImageStore(tmp_path / "store").hold(first.path), pytest.raises(ImageBusy):
        prep.prepare(pack, tmp_path / "store", 1, jobs=2, force=True)


def test_no_space_is_one_error_before_anything_is_written(pack_copy, tmp_path, monkeypatch):
    monkeypatch.setattr(prep, "free_bytes", lambda path: 10 << 20)
    with pytest.raises(BuildError, match="not enough free space"):
        prep.prepare(open_pack(pack_copy), tmp_path / "store", 2, jobs=2)
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())


def test_cli_bad_world_and_unwritable_output(pack_copy, tmp_path):
    bad = _tfc("prepare", str(pack_copy), "--tp", "3", "-o", str(tmp_path / "s"))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "'--tp'" in bad.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    unwritable = _tfc("prepare", str(pack_copy), "-o", str(blocker / "sub"))
    assert unwritable.returncode == 2 and unwritable.stderr.count("\n") == 1, unwritable.stderr
    assert "Traceback" not in unwritable.stderr


def _published(store: Path) -> list[Path]:
    return sorted(store.glob("*/rank*/manifest.json"))


@pytest.mark.slow
def test_sigkill_at_random_points_leaves_no_published_image(pack_copy, tmp_path):
    store = tmp_path / "store"
    delays = [0.3, 0.6, 0.9, 1.2, 1.6]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    for delay in delays:
        proc = subprocess.Popen([sys.executable, "-m", "tfc", "prepare", str(pack_copy), "--tp", "2", "-o", str(store)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)  # fmt: skip
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for manifest in _published(store):
            # whatever got published before the kill must be whole
            assert verify_image(manifest.parent).ok
    done = _tfc("prepare", str(pack_copy), "--tp", "2", "-o", str(store), "--json")
    assert done.returncode == 0, done.stderr
    assert len(_published(store)) == 2
    world = _published(store)[0].parent.parent
    assert not [p for p in world.iterdir() if p.name.startswith(".tmp")]
    assert verify_image(world).ok


def test_two_concurrent_prepares_publish_one_image(pack_copy, tmp_path):
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "tfc", "prepare", str(pack_copy), "--tp", "2", "-o", str(store), "--json"]
    procs = [
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    results = [json.loads(o[0]) for o in outs]
    assert len({r["path"] for r in results}) == 1
    # built once: one process built both ranks, the other waited and found them
    assert sorted(sorted(set(r["ranks"].values())) for r in results) == [["built"], ["hit"]]
    assert len(list(store.iterdir())) == 1
    assert len(_published(store)) == 2
    assert verify_image(next(store.iterdir())).ok


def test_engram_tables_from_a_separate_folder(pack_copy, tmp_path):
    """Published EXL3 packs lack the Engram tables: without them the image says so; --engram-dir adds them."""
    from tfc.cache.reader import open_rank

    tables = tmp_path / "engram"
    tables.mkdir()
    for f in pack_copy.glob("engram-*.safetensors"):
        f.rename(tables / f.name)
    index_path = pack_copy / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"] = {k: v for k, v in index["weight_map"].items() if not v.startswith("engram-")}
    index_path.write_text(json.dumps(index))
    bare = prep.prepare(open_pack(pack_copy), tmp_path / "store", 1, jobs=2)
    full = prep.prepare(open_pack(pack_copy), tmp_path / "store", 1, jobs=2, engram_dir=tables)
    assert bare.world_key != full.world_key
    with open_rank(bare.path / "rank0") as a, open_rank(full.path / "rank0") as b:
        assert a.manifest.plan["engram_tables"] is False and b.manifest.plan["engram_tables"] is True
        rows = [n for n in b.manifest.segment_map if n.endswith(".engram.rows")]
        assert rows and not [n for n in a.manifest.segment_map if n.endswith(".engram.rows")]
        assert "engram.token_map" in a.manifest.segment_map  # hash assets do not need the tables
