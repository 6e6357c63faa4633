"""Image format: round trip, digests, keys, and manifests as hostile input."""

from __future__ import annotations

import itertools
import json
import os

import numpy as np
import pytest
from test_cache_helpers import fields, random_segments, world_key_for, write_rank
from tfc.cache import digest as dg
from tfc.cache.errors import ImageError
from tfc.cache.format import ALIGN, RankManifest, root_digest_of
from tfc.cache.key import image_key, source_hash
from tfc.cache.reader import open_rank


def test_round_trip(tmp_path):
    segs = random_segments(1)
    wk = world_key_for("rt")
    path = write_rank(tmp_path, wk, 0, segs)
    assert path == tmp_path / wk[:16] / "rank0"
    with open_rank(path) as img:
        m = img.manifest
        assert (m.world_key, m.rank, m.world, m.family) == (wk, 0, 1, "deepseek_v41")
        assert m.plan == fields(wk)["plan"] and m.key_inputs == fields(wk)["key_inputs"]
        assert [s.name for s in m.segments] == list(segs)  # upload order = add order
        for name, a in segs.items():
            e = img.entry(name)
            assert e.offset % ALIGN == 0 and e.shape == a.shape and e.dtype == str(a.dtype)
            view = img.segment(name)
            assert view.readonly and bytes(view) == a.tobytes()
            assert e.digest == dg.digest_bytes(a)
            view.release()
        assert sorted(os.listdir(path)) == ["data0.bin", "data1.bin", "manifest.json"]
        for f in m.files:
            assert (path / f.name).stat().st_size == f.size and f.size % ALIGN == 0
    assert RankManifest.load(path / "manifest.json").root_digest == m.root_digest


def test_digest_paths_agree(tmp_path):
    """In-memory, streamed (odd chunk sizes) and file re-read digests are one function."""
    rng = np.random.default_rng(7)
    for n in (0, 1, dg.CHUNK, dg.CHUNK + 1, 5 * dg.CHUNK + 333):
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        whole = dg.segment_digest(data)
        s = dg.StreamingDigest(n)
        pos = 0
        while pos < n:
            step = int(rng.integers(1, 3 * dg.CHUNK))
            s.update(data[pos : pos + step])
            pos += step
        assert s.result() == whole
        # the same bytes fed in a random order of random pieces give the same digest
        cuts = sorted({0, n, *(int(c) for c in rng.integers(0, max(n, 1), 7))})
        pieces = list(itertools.pairwise(cuts))
        rng.shuffle(pieces)
        shuffled = dg.StreamingDigest(n)
        for a, b in pieces:
            shuffled.update(data[a:b], a)
        assert shuffled.complete and shuffled.result() == whole
        f = tmp_path / f"d{n}"
        f.write_bytes(b"\x01" * 4096 + data)
        fd = os.open(f, os.O_RDONLY)
        raw = dg.read_chunk_digests(fd, 4096, n, bytearray(dg.CHUNK * 2))
        os.close(fd)
        assert dg.finish(raw, n) == whole
        assert len(whole.chunks) == (dg.chunk_count(n) if n > dg.CHUNK else 0)
    flipped = bytearray(data)
    flipped[-1] ^= 1
    assert dg.digest_bytes(flipped) != dg.digest_bytes(data)


def test_keys(tmp_path):
    a = {"world": 2, "pack": {"b": 1, "a": [1, 2]}}
    assert image_key(a) == image_key(json.loads(json.dumps(a, sort_keys=False)))
    assert image_key(a) != image_key({**a, "world": 4}) and len(image_key(a)) == 64
    (tmp_path / "x").mkdir()
    f1, f2 = tmp_path / "x" / "one.py", tmp_path / "two.py"
    f1.write_text("print(1)\n")
    f2.write_text("print(2)\n")
    h = source_hash([f1, f2])
    assert h == source_hash([f2, f1])
    f1.write_text("print(3)\n")
    assert source_hash([f1, f2]) != h
    with pytest.raises(ImageError):
        image_key({"p": tmp_path})


def _manifest_obj(tmp_path):
    path = write_rank(tmp_path, world_key_for("hostile"), 0, random_segments(3))
    return path, json.loads((path / "manifest.json").read_text())


def _resign(obj):
    body = {k: v for k, v in obj.items() if k != "root_digest"}
    obj["root_digest"] = root_digest_of(body)
    return obj


def _size(obj, name):
    return next(f["size"] for f in obj["files"] if f["name"] == name)


def _seg(obj, i=0):
    return obj["segments"][i]


HOSTILE = {
    "file path traversal": lambda o: (
        o["files"][0].__setitem__("name", "../../etc/passwd"),
        _seg(o).__setitem__("file", "../../etc/passwd"),
    ),
    "absolute file": lambda o: o["files"][0].__setitem__("name", "/tmp/x.bin"),
    "file not listed": lambda o: _seg(o).__setitem__("file", "other.bin"),
    "unaligned offset": lambda o: _seg(o, 1).__setitem__("offset", _seg(o, 1)["offset"] + 8),
    "outside file": lambda o: _seg(o, -1).__setitem__("offset", _size(o, _seg(o, -1)["file"])),
    "overlap": lambda o: _seg(o, 2).__setitem__("offset", _seg(o, 0)["offset"]),
    "negative length": lambda o: _seg(o).__setitem__("length", -1),
    "bool as int": lambda o: _seg(o).__setitem__("offset", False),
    "float offset": lambda o: _seg(o).__setitem__("offset", 0.0),
    "shape/length mismatch": lambda o: _seg(o).__setitem__("shape", [4, 6, 49]),
    "unknown dtype": lambda o: _seg(o).__setitem__("dtype", "complex64"),
    "ndim too large": lambda o: _seg(o).__setitem__("shape", [1] * 9 + list(_seg(o)["shape"])),
    "bad digest": lambda o: _seg(o).__setitem__("digest", "zz" * 32),
    "chunk count": lambda o: _seg(o, -1).__setitem__("chunks", _seg(o, -1)["chunks"][:-1]),
    "chunk not matching digest": lambda o: _seg(o, -1)["chunks"].__setitem__(0, "0" * 64),
    "duplicate segment": lambda o: o["segments"].append(dict(_seg(o))),
    "bad segment name": lambda o: _seg(o).__setitem__("name", "a/b"),
    "unknown field": lambda o: o.__setitem__("extra", 1),
    "missing field": lambda o: o.pop("plan"),
    "rank outside world": lambda o: o.__setitem__("rank", 1),
    "bad layout": lambda o: _seg(o).__setitem__("layout", "Native v1"),
    "file size not aligned": lambda o: o["files"][0].__setitem__("size", o["files"][0]["size"] + 1),
    "plan not an object": lambda o: o.__setitem__("plan", [1]),
    "unknown tier": lambda o: _seg(o).__setitem__("tier", "gpu"),
    "tier not a string": lambda o: _seg(o).__setitem__("tier", 1),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_manifest_rejected(tmp_path, case):
    path, obj = _manifest_obj(tmp_path)
    HOSTILE[case](obj)
    (path / "manifest.json").write_text(json.dumps(_resign(obj)))
    with pytest.raises(ImageError):
        RankManifest.load(path)
    with pytest.raises(ImageError):
        open_rank(path)


def test_hostile_bytes(tmp_path, monkeypatch):
    path, obj = _manifest_obj(tmp_path)
    mf = path / "manifest.json"
    good = mf.read_bytes()
    bad = {
        "root digest": good.replace(b'"rank":0', b'"rank": 0 ').replace(b'"world":1', b'"world":2'),
        "not json": b"{ nope",
        "not an object": b"[1,2]",
        "not utf-8": b'{"a": "\xff"}',
        "duplicate key": good[:-2] + b',"rank":0}\n',
        "nan": good.replace(b'"world":1', b'"world":NaN'),
        "deep nesting": b'{"plan":' + b"[" * 100000 + b"]" * 100000 + b"}",
    }
    for name, data in bad.items():
        mf.write_bytes(data)
        with pytest.raises(ImageError):
            RankManifest.load(path)
        assert name
    obj["format_version"] = 2
    mf.write_text(json.dumps(_resign(obj)))
    with pytest.raises(ImageError, match="re-run `tfc prepare`"):
        RankManifest.load(path)
    monkeypatch.setattr("tfc.cache.manifest_parse.MAX_MANIFEST_BYTES", 100)
    mf.write_bytes(good)
    with pytest.raises(ImageError, match="limit"):
        RankManifest.load(path)


def test_symlinked_manifest_and_file_refused(tmp_path):
    path, _ = _manifest_obj(tmp_path)
    os.rename(path / "data0.bin", tmp_path / "elsewhere.bin")
    os.symlink(tmp_path / "elsewhere.bin", path / "data0.bin")
    with pytest.raises(ImageError, match=r"data0\.bin"):
        open_rank(path)
    os.rename(path / "manifest.json", tmp_path / "m.json")
    os.symlink(tmp_path / "m.json", path / "manifest.json")
    with pytest.raises(ImageError):
        RankManifest.load(path)


def test_truncated_file_named_by_open_rank(tmp_path):
    path, _ = _manifest_obj(tmp_path)
    os.truncate(path / "data1.bin", 4096)
    with pytest.raises(ImageError, match=r"data1\.bin.*truncated"):
        open_rank(path)
