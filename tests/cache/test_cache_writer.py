"""ImageWriter: threaded positional writes, digests, atomic publish under SIGKILL, concurrent writers, free space."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from test_cache_helpers import fields, random_segments, world_key_for, write_rank
from tfc.cache import digest as dg
from tfc.cache.errors import ImageError
from tfc.cache.reader import open_rank
from tfc.cache.store import ImageStore
from tfc.cache.verify import verify_image
from tfc.cache.writer import ImageWriter

# The child writes a 3-segment image, the big one in 1 MiB pieces; KILL="<fn>:<n>" SIGKILLs it at the
# n-th call of os.<fn> (before the call runs), so the kill lands inside a chosen phase of the write.
CHILD = textwrap.dedent(
    """
    import json, os, random, signal, sys, time
    from pathlib import Path
    root, wk, kill, barrier = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    inputs = json.loads(sys.argv[5])
    if kill != "none":
        fn, n = kill.split(":")
        real, calls = getattr(os, fn), [0]
        def trap(*a, **k):
            calls[0] += 1
            if calls[0] == int(n):
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*a, **k)
        setattr(os, fn, trap)
    from tfc.cache.key import image_key
    from tfc.cache.writer import ImageWriter
    rng = random.Random(5)
    big = rng.randbytes(9 << 20)
    small = [rng.randbytes(n) for n in (4000, 123457)]
    with ImageWriter(root, wk, 0) as w:
        slots = [w.add_segment(f"s{i}", "uint8", [len(b)], "native.v1", len(b), "data.bin") for i, b in enumerate(small)]
        sbig = w.add_segment("big", "uint8", [len(big)], "native.v1", len(big), "experts.bin")
        for s, b in zip(slots, small):
            w.write(s, 0, b)
        for off in range(0, len(big), 1 << 20):
            w.write(sbig, off, big[off : off + (1 << 20)])
        if barrier != "none":
            Path(barrier, f"ready-{os.getpid()}").touch()
            while len(list(Path(barrier).glob("ready-*"))) < 2:
                time.sleep(0.005)
        print(w.publish({"family": "deepseek_v41", "key": image_key({"world_key": wk, "rank": 0}),
                         "key_inputs": inputs, "world": 1, "plan": {}}))
    """
)


def _child(root: Path, wk: str, kill: str = "none", barrier: str = "none", wait: bool = True):
    args = [sys.executable, "-c", CHILD, str(root), wk, kill, barrier, json.dumps(fields(wk)["key_inputs"])]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if not wait:
        return p
    out, err = p.communicate(timeout=60)
    return p.returncode, out.strip(), err


def test_sigkill_at_random_points_never_publishes(tmp_path):
    wk = world_key_for("kill")
    world = tmp_path / wk[:16]
    rng = random.Random(11)
    points = [
        "pwrite:1",
        f"pwrite:{rng.randint(2, 9)}",
        f"pwrite:{rng.randint(2, 11)}",
        "ftruncate:2",
        "fsync:1",
        "fsync:2",
        "fsync:3",
        "write:1",
        "rename:1",
    ]
    for point in points:
        code, out, err = _child(tmp_path, wk, point)
        assert code == -signal.SIGKILL, (point, code, err)
        assert not (world / "rank0").exists(), point
        assert ImageStore(tmp_path).find(wk) is None
        assert any(p.name.startswith(".tmp-rank0-") for p in world.iterdir()), point
    code, out, err = _child(tmp_path, wk)
    assert code == 0, err
    assert Path(out) == world / "rank0"
    assert not [p for p in world.iterdir() if p.name.startswith(".tmp-")]  # dead writers' temps removed
    report = verify_image(world)
    assert report.ok and report.segments == 3


def test_concurrent_writers_publish_one_image(tmp_path):
    wk = world_key_for("race")
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    procs = [_child(tmp_path, wk, barrier=str(barrier), wait=False) for _ in range(2)]
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    paths = {out.strip() for out, _ in results}
    world = tmp_path / wk[:16]
    assert paths == {str(world / "rank0")}
    assert sorted(p.name for p in world.iterdir() if not p.name.startswith(".")) == ["rank0"]
    assert not [p for p in world.iterdir() if p.name.startswith(".tmp-")]
    assert verify_image(world).ok


def test_threaded_out_of_order_writes(tmp_path, monkeypatch):
    # digests are assembled while writing, in any order: publish never reads the image back
    monkeypatch.setattr(ImageWriter, "_rehash", lambda self, states: pytest.fail("publish re-read a segment"))
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 5 * dg.CHUNK + 999, dtype=np.uint8)
    small = rng.integers(-1000, 1000, (33, 17), dtype=np.int32)
    wk = world_key_for("threads")
    with ImageWriter(tmp_path, wk, 0) as w:
        big = w.add_segment("big", "uint8", data.shape, "native.v1", data.nbytes, "a.bin")
        s = w.add_segment("small", "int32", small.shape, "native.v1", small.nbytes, "a.bin")
        pieces = list(range(0, data.nbytes, 777_777))
        random.Random(1).shuffle(pieces)
        threads = [threading.Thread(target=w.write, args=(big, o, data[o : o + 777_777])) for o in pieces]
        for t in threads:
            t.start()
        w.write(s, 0, small)
        for t in threads:
            t.join()
        path = w.publish(fields(wk))
    with open_rank(path) as img:
        assert img.entry("big").digest == dg.digest_bytes(data)
        assert img.entry("small").digest == dg.digest_bytes(small)
        assert img.entry("small").offset == ((data.nbytes + 4095) // 4096) * 4096
        v = img.segment("big")
        assert bytes(v) == data.tobytes()
        v.release()


def test_given_digests(tmp_path):
    segs = random_segments(4)
    wk = world_key_for("given")
    with ImageWriter(tmp_path, wk, 0) as w:
        for name, a in segs.items():
            w.write(w.add_segment(name, str(a.dtype), a.shape, "native.v1", a.nbytes), 0, a)
        given = {n: dg.segment_digest(a) for n, a in segs.items()}
        given["layers.0.norm"] = dg.digest_bytes(np.zeros(1000, np.float32))  # wrong: must be caught
        with pytest.raises(ImageError, match=r"layers\.0\.norm.*given digest"):
            w.publish(fields(wk), digests=given)
    assert not (tmp_path / wk[:16] / "rank0").exists()
    with ImageWriter(tmp_path, wk, 0) as w:
        for name, a in segs.items():
            w.write(w.add_segment(name, str(a.dtype), a.shape, "native.v1", a.nbytes), 0, a)
        path = w.publish(fields(wk), digests={n: dg.segment_digest(a) for n, a in segs.items()})
    assert verify_image(path).ok


def test_bad_requests(tmp_path):
    wk = world_key_for("bad")
    with ImageWriter(tmp_path, wk, 0) as w:
        for args in [
            ("a/b", "uint8", [4], "native.v1", 4, "d.bin"),
            ("a", "uint8", [4], "native.v1", 4, "../d.bin"),
            ("a", "uint8", [4], "native.v1", 4, "d.txt"),
            ("a", "uint8", [4], "native.v1", 5, "d.bin"),
            ("a", "complex64", [4], "native.v1", 32, "d.bin"),
            ("a", "uint8", [4], "Bad Layout", 4, "d.bin"),
        ]:
            with pytest.raises(ImageError):
                w.add_segment(*args)
        s = w.add_segment("a", "uint8", [4], "native.v1", 4, "d.bin")
        with pytest.raises(ImageError, match="added twice"):
            w.add_segment("a", "uint8", [4], "native.v1", 4, "d.bin")
        with pytest.raises(ImageError, match="exceeds"):
            w.write(s, 2, b"abc")
        w.write(s, 0, b"ab")
        with pytest.raises(ImageError, match="only 2 of 4 bytes"):
            w.publish(fields(wk))
    world = tmp_path / wk[:16]
    assert not (world / "rank0").exists() and not [p for p in world.iterdir() if p.name.startswith(".tmp")]
    with pytest.raises(ImageError):
        ImageWriter(tmp_path, "not-a-key", 0)


def test_free_space_failure(tmp_path, monkeypatch):
    monkeypatch.setattr("tfc.cache.writer.free_bytes", lambda path: 5 << 20)
    wk = world_key_for("space")
    with pytest.raises(ImageError, match="not enough free space"):
        ImageWriter(tmp_path, wk, 0, expected_bytes=100 << 30)
    with pytest.raises(ImageError, match=r"not enough free space.*GB free"):
        write_rank(tmp_path, wk, 0, random_segments(1))
    world = tmp_path / wk[:16]
    assert not (world / "rank0").exists() and not [p for p in world.iterdir() if p.name.startswith(".tmp")]
    monkeypatch.setattr("tfc.cache.writer.free_bytes", lambda path: 100 << 30)
    assert verify_image(write_rank(tmp_path, wk, 0, random_segments(1))).ok


def test_enospc_while_writing_is_one_clear_error(tmp_path, monkeypatch):
    import errno

    def full(*a):
        raise OSError(errno.ENOSPC, "No space left on device")

    wk = world_key_for("enospc")
    with ImageWriter(tmp_path, wk, 0) as w:
        s = w.add_segment("a", "uint8", [8], "native.v1", 8, "d.bin")
        monkeypatch.setattr(os, "pwrite", full)
        with pytest.raises(ImageError, match=r"no space left writing .*d\.bin"):
            w.write(s, 0, b"12345678")


def test_existing_rank_is_returned_not_replaced(tmp_path):
    wk = world_key_for("exists")
    first = write_rank(tmp_path, wk, 0, random_segments(1))
    before = (first / "manifest.json").read_bytes()
    second = write_rank(tmp_path, wk, 0, random_segments(2))
    assert second == first and (first / "manifest.json").read_bytes() == before
