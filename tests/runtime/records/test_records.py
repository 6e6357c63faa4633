"""The NVMe record reader on temp files: the records it returns are the file's (io_uring and threads, O_DIRECT and
buffered, records across block edges, repeats), a short file or a failed read is a typed error, refusals fall
back and say so; the LRU keeps the most recent records and counts hits; prefetch fills it; host tables."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os

import numpy as np
import pytest
from tfc.runtime.records import uring
from tfc.runtime.records.reader import BLOCK, RecordConfig, RecordFile, RecordReadError, _extents
from tfc.runtime.records.source import FileRecords, RecordCache, TableRecords

SIZE = 264  # DeepSeek-V4.1's record: 256 e4m3 values, then 8 e8m0 scales
ROWS = 3000
OFFSET = 3 * BLOCK  # a segment after others in its file


@pytest.fixture
def table(tmp_path):
    """(path, records [ROWS, SIZE]) of a file holding random records at OFFSET after random bytes."""
    rng = np.random.default_rng(5)
    records = rng.integers(0, 256, (ROWS, SIZE), dtype=np.uint8)
    path = tmp_path / "L01.bin"
    with open(path, "wb") as f:
        f.write(rng.integers(0, 256, OFFSET, dtype=np.uint8).tobytes())
        f.write(records.tobytes())
    return path, records


def _rows(seed: int, n: int) -> np.ndarray:
    rows = np.random.default_rng(seed).integers(0, ROWS, n)
    return np.concatenate(
        [rows, rows[:7], [0, ROWS - 1, 15, 16]]
    )  # repeats, both ends, a record across a block


def _uring_allowed() -> bool:
    try:
        uring.Ring(4).close()
    except OSError:
        return False
    return True


@pytest.mark.parametrize("use_uring", [True, False])
@pytest.mark.parametrize("direct", [True, False])
def test_records_are_the_files_bytes(table, use_uring, direct):
    if use_uring and not _uring_allowed():
        pytest.skip("this kernel refuses io_uring")
    path, records = table
    config = RecordConfig(uring=use_uring, direct=direct, threads=4, queue_depth=8)
    f = RecordFile(path, OFFSET, ROWS * SIZE, SIZE, config)
    try:
        assert f.method == f"{'io_uring' if use_uring else 'threads'}, {'O_DIRECT' if direct else 'buffered'}"
        rows = _rows(1, 400)
        np.testing.assert_array_equal(f.read(rows), records[rows])
        assert f.read(np.zeros(0, np.int64)).shape == (0, SIZE)
        with pytest.raises(RecordReadError, match="outside"):
            f.read(np.array([ROWS]))
    finally:
        f.close()


def test_neighbouring_blocks_merge_up_to_the_extent_and_cover_every_record():
    starts = OFFSET + np.array([0, 15, 16, 60, 2000], np.int64) * SIZE
    extents = _extents(starts, SIZE, 4 * BLOCK)
    for s in starts:  # every record lies whole inside one extent, within the bytes it needs
        assert any(a <= s and s + SIZE <= a + need <= b for a, b, need in extents)
    assert all(a % BLOCK == 0 and b % BLOCK == 0 and b - a <= 4 * BLOCK for a, b, _ in extents)
    assert len(extents) == 3  # rows 0-16 share two blocks; 60 lies past a gap; 2000 far away


def test_a_short_file_is_a_typed_error_and_never_other_bytes(table):
    path, records = table
    with pytest.raises(RecordReadError, match="shorter than its records' end"):
        RecordFile(path, OFFSET, (ROWS + 1) * SIZE, SIZE)
    f = RecordFile(path, OFFSET, ROWS * SIZE, SIZE, RecordConfig(threads=2))
    try:
        os.truncate(path, OFFSET + 1000 * SIZE + 100)  # the drive lost the tail after the boot checked it
        np.testing.assert_array_equal(f.read(np.array([5, 999])), records[[5, 999]])
        with pytest.raises(RecordReadError, match="the file is shorter than the image says"):
            f.read(np.array([5, 1000, 2500]))
    finally:
        f.close()


def test_o_direct_refused_at_open_falls_back_to_buffered_reads(table):
    path, records = table

    def opener(p: str, flags: int) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return os.open(p, flags)

    f = RecordFile(path, OFFSET, ROWS * SIZE, SIZE, RecordConfig(uring=False, threads=2), opener=opener)
    try:
        assert not f.direct and f.notes == ["O_DIRECT refused at open: buffered reads"]
        rows = _rows(2, 50)
        np.testing.assert_array_equal(f.read(rows), records[rows])
    finally:
        f.close()


class RefusingRing:
    """A ring whose reads answer EINVAL while the file is open with O_DIRECT (as some file systems do)."""

    def __init__(self, owner: dict) -> None:
        self.owner = owner

    def read(self, fd, requests):
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            return [-errno.EINVAL] * len(requests)
        self.owner["buffered"] += 1
        out = []
        for addr, n, off in requests:
            data = os.pread(fd, n, off)
            ctypes.memmove(addr, data, len(data))
            out.append(len(data))
        return out

    def close(self):
        pass


def test_o_direct_refused_at_a_read_is_retried_buffered_and_said(table):
    path, records = table
    seen = {"buffered": 0}
    f = RecordFile(path, OFFSET, ROWS * SIZE, SIZE, open_ring=lambda n: RefusingRing(seen))
    try:
        rows = _rows(3, 30)
        np.testing.assert_array_equal(f.read(rows), records[rows])
        assert (
            not f.direct
            and seen["buffered"] == 1
            and f.notes == ["O_DIRECT refused at a read: buffered reads"]
        )
    finally:
        f.close()


def test_io_uring_refused_falls_back_to_threads(table):
    path, records = table

    def refuse(entries: int):
        raise OSError(errno.EPERM, "Operation not permitted")

    f = RecordFile(path, OFFSET, ROWS * SIZE, SIZE, RecordConfig(threads=3), open_ring=refuse)
    try:
        assert f.method.startswith("threads") and f.notes == [
            "io_uring refused (Operation not permitted): 3 reader threads"
        ]
        rows = _rows(4, 80)
        np.testing.assert_array_equal(f.read(rows), records[rows])
    finally:
        f.close()


def test_a_missing_or_unreadable_file_is_one_line(tmp_path):
    with pytest.raises(RecordReadError, match="cannot open it") as info:
        RecordFile(tmp_path / "gone.bin", 0, SIZE, SIZE)
    assert "\n" not in str(info.value)


def test_the_ring_reads_what_pread_reads_and_reports_errors_per_read(table):
    if not _uring_allowed():
        pytest.skip("this kernel refuses io_uring")
    import mmap

    path, _ = table
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    ring = uring.Ring(4)
    buf = mmap.mmap(-1, 16 * BLOCK)
    base = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    try:
        offsets = [(i * 7919) % (size - BLOCK) for i in range(10)]  # more reads than the ring's entries
        got = ring.read(fd, [(base + i * BLOCK, BLOCK, off) for i, off in enumerate(offsets)])
        assert got == [BLOCK] * 10
        for i, off in enumerate(offsets):
            assert buf[i * BLOCK : (i + 1) * BLOCK] == os.pread(fd, BLOCK, off)
        assert ring.read(fd, [(base, 2 * BLOCK, size - 100)]) == [100]  # short at the end of the file
        assert ring.read(-5, [(base, BLOCK, 0)]) == [-errno.EBADF]
    finally:
        ring.close()
        os.close(fd)
        base = None
        buf.close()


def test_the_lru_keeps_the_most_recent_records_and_counts_hits():
    cache = RecordCache(3, 4)
    rec = np.arange(40, dtype=np.uint8).reshape(10, 4)
    cache.put(np.array([1, 2, 3]), rec[[1, 2, 3]])
    out = np.zeros((2, 4), np.uint8)
    assert cache.take(np.array([1, 9]), out).tolist() == [True, False]  # 1 is now the most recent
    np.testing.assert_array_equal(out[0], rec[1])
    cache.put(np.array([4]), rec[[4]])  # evicts 2, the least recently used
    assert cache.has(np.array([1, 2, 3, 4])).tolist() == [True, False, True, True]
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 3)
    cache.put(np.arange(5, 10), rec[5:10])  # more than it holds: the last three stay
    assert cache.has(np.arange(10)).tolist() == [False] * 7 + [True] * 3


def test_file_records_read_once_then_hit_and_prefetch_fills_the_lru(table):
    path, records = table
    config = RecordConfig(cache_records=500, threads=2)
    src = FileRecords(RecordFile(path, OFFSET, ROWS * SIZE, SIZE, config), config)
    try:
        rows = _rows(6, 100)
        np.testing.assert_array_equal(src.gather(rows), records[rows])
        misses = src.cache.misses
        np.testing.assert_array_equal(src.gather(rows[::-1]), records[rows[::-1]])
        assert src.cache.misses == misses and src.cache.hits == len(np.unique(rows))
        ahead = np.arange(2000, 2100)
        src.prefetch(ahead)
        src._settle()
        assert src.cache.has(ahead).all()
        np.testing.assert_array_equal(src.gather(ahead), records[ahead])
        assert src.cache.misses == misses
    finally:
        src.close()


def test_a_host_table_gathers_its_rows_and_refuses_others():
    table = np.random.default_rng(7).integers(0, 256, (50, SIZE), dtype=np.uint8)
    src = TableRecords(table, "host tier layers.1.engram.rows")
    rows = np.array([3, 3, 49, 0])
    np.testing.assert_array_equal(src.gather(rows), table[rows])
    with pytest.raises(RecordReadError, match=r"host tier layers\.1\.engram\.rows: records outside"):
        src.gather(np.array([50]))
