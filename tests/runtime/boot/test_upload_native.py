"""The native copy loop (runtime/boot/stage_copy.c through runtime/boot/upload_native.py) with host-only stand-ins for
the CUDA driver calls: the bytes arrive, every slot is waited for before reuse, failures stop it in one line."""

from __future__ import annotations

import mmap
import shutil

import numpy as np
import pytest
from support.fakes import FakeDriver

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TFC_NATIVE_CACHE", str(tmp_path_factory.getbasetemp() / "native"))


def _plan(src: np.ndarray, dst: np.ndarray, piece: int) -> np.ndarray:
    rows = [
        (src.ctypes.data + o, dst.ctypes.data + o, min(piece, src.size - o))
        for o in range(0, src.size, piece)
    ]
    return np.array(rows, dtype=np.uint64)


@pytest.mark.parametrize(("threads", "per", "piece"), [(1, 1, 4096), (3, 2, 5000), (4, 3, 1 << 16)])
def test_native_copies_every_byte(threads, per, piece):
    from tfc.runtime.boot.upload_native import stage

    rng = np.random.default_rng(threads)
    src = rng.integers(0, 256, size=300_001, dtype=np.uint8)
    dst = np.zeros_like(src)
    slots = [np.zeros(piece, dtype=np.uint8) for _ in range(threads * per)]
    drv, seen = FakeDriver(), []
    rows = _plan(src, dst, piece)
    times = stage(rows, [s.ctypes.data for s in slots], threads, list(range(1, threads + 1)),
                  list(range(100, 100 + threads * per)), drv.calls(), drop=False, tick=seen.append)  # fmt: skip
    assert np.array_equal(src, dst)
    assert drv.copies == drv.records == len(rows) and drv.reused_unsynced == 0 and not drv.pending
    assert sum(seen) == src.size and times.copy >= 0 and times.wait >= 0


def test_native_drops_page_tables_of_a_file_mapping(tmp_path):
    """drop: the pieces of a read-only file mapping are copied, then MADV_DONTNEED'd, bytes intact."""
    from tfc.runtime.boot.upload_native import stage

    data = np.random.default_rng(1).integers(0, 256, size=1 << 20, dtype=np.uint8)
    path = tmp_path / "f.bin"
    path.write_bytes(data.tobytes())
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as mm:
        src = np.frombuffer(mm, dtype=np.uint8)
        dst = np.zeros_like(data)
        slots = [np.zeros(1 << 16, dtype=np.uint8) for _ in range(4)]
        stage(_plan(src, dst, 1 << 16), [s.ctypes.data for s in slots], 2, [1, 2], [10, 11, 12, 13],
              FakeDriver().calls(), drop=True)  # fmt: skip
        assert np.array_equal(dst, data) and np.array_equal(src, data)
        del src


def test_native_failure_is_one_typed_line():
    from tfc.runtime.boot.upload import UploadError
    from tfc.runtime.boot.upload_native import stage

    src = np.arange(100_000, dtype=np.uint8)
    dst = np.zeros_like(src)
    slots = [np.zeros(4096, dtype=np.uint8) for _ in range(4)]
    drv = FakeDriver(fail_at=5, code=700)
    with pytest.raises(UploadError, match="driver result 700"):
        stage(_plan(src, dst, 4096), [s.ctypes.data for s in slots], 2, [1, 2], [1, 2, 3, 4], drv.calls())
    assert not drv.pending  # the threads waited for their slots' copies before returning
    with pytest.raises(UploadError, match="1-64 slots per thread"):
        stage(_plan(src, dst, 4096), [s.ctypes.data for s in slots], 3, [1, 2, 3], [1, 2, 3, 4], drv.calls())


def test_native_build_failure_names_the_compiler(monkeypatch, tmp_path):
    from tfc.runtime.boot import upload_native
    from tfc.runtime.boot.upload import UploadError

    monkeypatch.setenv("TFC_NATIVE_CACHE", str(tmp_path / "fresh"))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    monkeypatch.setattr(upload_native, "_LIB", [])
    with pytest.raises(UploadError, match=r"needs a C compiler \(/nonexistent/cc"):
        upload_native.library()


def test_native_cache_that_cannot_be_written_is_one_line(monkeypatch, tmp_path):
    from tfc.runtime.boot import upload_native
    from tfc.runtime.boot.upload import UploadError

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("TFC_NATIVE_CACHE", str(blocker / "native"))
    monkeypatch.setattr(upload_native, "_LIB", [])
    with pytest.raises(UploadError, match=r"cannot write the native copier into .*; set TFC_NATIVE_CACHE"):
        upload_native.library()


def test_native_copier_options_are_checked():
    from tfc.runtime.boot.upload import UploadError
    from tfc.runtime.boot.upload_mmap import MmapStaging, staging_for

    assert staging_for(4, copier="native").copier == "native"
    assert "C threads" in staging_for(4, copier="native").describe()
    for bad in (dict(copier="rust"), dict(copier="native", slots_per_thread=65)):
        with pytest.raises(UploadError):
            MmapStaging(4, **bad)


def test_native_stops_when_interrupted():
    """An exception in the caller while the loop runs (a failing progress callback here, Ctrl-C in use) stops
    the C threads, waits for the copies they issued, and propagates."""
    from tfc.runtime.boot.upload_native import stage

    src = np.arange(4_000_000, dtype=np.uint8)
    dst = np.zeros_like(src)
    slots = [np.zeros(4096, dtype=np.uint8) for _ in range(2)]
    drv = FakeDriver(delay=0.001)  # ~0.5 s of copies: the first progress poll (50 ms) comes well inside

    def tick(n):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        stage(
            _plan(src, dst, 4096), [s.ctypes.data for s in slots], 2, [1, 2], [1, 2], drv.calls(), tick=tick
        )
    assert not drv.pending and drv.copies < len(_plan(src, dst, 4096))  # stopped early, nothing in flight
