"""Records of one segment read in place from its image file: the 4 KiB blocks holding the wanted records, with
O_DIRECT (no page cache between the drive and the LRU), through io_uring or a pool of `preadv` threads.

Every segment starts on a 4 KiB boundary of its file, so record r lies in the blocks [offset + r * size,
offset + (r + 1) * size) rounds out to; the blocks of neighbouring records merge into one read up to
`extent_bytes`. A file system that refuses O_DIRECT (at open or at the first read) is read buffered; a kernel
that refuses io_uring is read by threads; both are said in `notes`. A failed or short read raises
`RecordReadError`: never a record of other bytes.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tfc.errors import TfcError

BLOCK = 4096  # the image's alignment, and at least the logical block size O_DIRECT needs


class RecordReadError(TfcError):
    """A record that could not be read from its file (an I/O error, a file shorter than the image says)."""


@dataclass(frozen=True)
class RecordConfig:
    """How off-device records are read and kept: the LRU's records per segment, io_uring's queue depth, reader
    threads where io_uring is refused, O_DIRECT, and the most bytes one read merges."""

    cache_records: int = 65536
    queue_depth: int = 256
    threads: int = 16
    direct: bool = True
    uring: bool = True
    extent_bytes: int = 64 << 10

    def __post_init__(self) -> None:
        if self.cache_records < 0 or self.queue_depth < 1 or self.threads < 1:
            raise ValueError("record config: cache_records >= 0, queue_depth and threads >= 1")
        if self.extent_bytes < 2 * BLOCK or self.extent_bytes % BLOCK:
            raise ValueError(
                f"record config: extent_bytes must be a multiple of {BLOCK} of at least two blocks"
            )


def _open_ring(entries: int):
    from tfc.runtime.records.uring import Ring

    return Ring(entries)


class RecordFile:
    """`rows` records of `record_bytes` at `offset` of `path`; `read(rows)` returns their bytes."""

    def __init__(self, path: str | Path, offset: int, length: int, record_bytes: int,
                 config: RecordConfig = RecordConfig(), opener: Callable[[str, int], int] = os.open,
                 open_ring: Callable[[int], object] = _open_ring) -> None:  # fmt: skip
        if offset % BLOCK or record_bytes < 1 or length % record_bytes:
            raise RecordReadError(
                f"{path}: records of {record_bytes} bytes at offset {offset} are not aligned"
            )
        self.path, self.offset, self.record_bytes = Path(path), offset, record_bytes
        self.rows = length // record_bytes
        self.config = config
        self.notes: list[str] = []
        self._opener = opener
        self._lock = threading.Lock()
        self._ring = self._pool = None
        self.direct = config.direct
        self.fd = self._open()
        try:
            size = os.fstat(self.fd).st_size
        except OSError as error:
            self.close()
            raise RecordReadError(f"{self.path}: cannot read it ({error.strerror})") from None
        if size < offset + length:
            self.close()
            raise RecordReadError(
                f"{self.path} is {size:,} bytes, shorter than its records' end at {offset + length:,}: "
                "the image is damaged; re-run `tfc prepare`"
            )
        if config.uring:
            try:
                self._ring = open_ring(config.queue_depth)
            except OSError as error:
                self.notes.append(f"io_uring refused ({error.strerror}): {config.threads} reader threads")

    @property
    def method(self) -> str:
        """How reads go: io_uring or threads, O_DIRECT or buffered."""
        return f"{'io_uring' if self._ring is not None else 'threads'}, {'O_DIRECT' if self.direct else 'buffered'}"

    def _open(self) -> int:
        """The file's descriptor, O_DIRECT unless refused (then buffered, noted)."""
        if self.direct:
            try:
                return self._opener(str(self.path), os.O_RDONLY | os.O_DIRECT)
            except OSError as error:
                if error.errno != errno.EINVAL:
                    raise RecordReadError(f"{self.path}: cannot open it ({error.strerror})") from None
                self._buffered("at open")
        try:
            return self._opener(str(self.path), os.O_RDONLY)
        except OSError as error:
            raise RecordReadError(f"{self.path}: cannot open it ({error.strerror})") from None

    def _buffered(self, where: str) -> None:
        self.direct = False
        self.notes.append(f"O_DIRECT refused {where}: buffered reads")

    def read(self, rows: np.ndarray) -> np.ndarray:
        """uint8 [n, record_bytes] of the local `rows` (any order, repeats allowed)."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        out = np.empty((rows.size, self.record_bytes), np.uint8)
        if not rows.size:
            return out
        if int(rows.min()) < 0 or int(rows.max()) >= self.rows:
            raise RecordReadError(f"{self.path}: records outside [0, {self.rows})")
        want, inverse = np.unique(rows, return_inverse=True)
        starts = self.offset + want * self.record_bytes
        extents = _extents(starts, self.record_bytes, self.config.extent_bytes)
        sizes = [e[1] - e[0] for e in extents]
        buf = _aligned(sum(sizes))  # O_DIRECT reads into block-aligned memory
        at = np.cumsum([0, *sizes[:-1]])
        with self._lock:
            self._read_extents(buf, extents, at)
        first = np.array([e[0] for e in extents], np.int64)
        which = np.searchsorted(first, starts, side="right") - 1
        records = buf[(at[which] + (starts - first[which]))[:, None] + np.arange(self.record_bytes)]
        out[:] = records[inverse]
        return out

    def _read_extents(self, buf: np.ndarray, extents: list[tuple[int, int, int]], at: np.ndarray) -> None:
        """Fill `buf` at `at` with each extent (start, end, bytes needed); a refused O_DIRECT read is retried
        buffered once."""
        try:
            got = self._submit(buf, extents, at)
        except OSError as error:
            if error.errno != errno.EINVAL or not self.direct:
                raise RecordReadError(f"{self.path}: read failed ({error.strerror})") from None
            got = [-errno.EINVAL]
        if self.direct and any(g == -errno.EINVAL for g in got):
            os.close(self.fd)
            self._buffered("at a read")
            self.fd = self._open()
            got = self._submit(buf, extents, at)
        for (start, _, need), n in zip(extents, got, strict=True):
            if n < 0:
                raise RecordReadError(f"{self.path}: reading at {start:,} failed ({os.strerror(-n)})")
            if n < need:
                raise RecordReadError(
                    f"{self.path}: a read at {start:,} returned {n:,} of {need:,} bytes: the file is shorter "
                    "than the image says"
                )

    def _submit(self, buf: np.ndarray, extents: list[tuple[int, int, int]], at: np.ndarray) -> list[int]:
        """Bytes each extent read (-errno for a failure)."""
        base = buf.ctypes.data
        if self._ring is not None:
            return self._ring.read(
                self.fd, [(base + int(a), e[1] - e[0], e[0]) for a, e in zip(at, extents, strict=True)]
            )
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.config.threads, thread_name_prefix="tfc-records")
        view = memoryview(buf)

        def one(i: int) -> int:
            start, end, need = extents[i]
            done, a = 0, int(at[i])
            while done < need:
                try:
                    n = os.preadv(self.fd, [view[a + done : a + end - start]], start + done)
                except OSError as error:
                    return -error.errno
                if n <= 0:
                    break
                done += n
            return done

        return list(self._pool.map(one, range(len(extents))))

    def close(self) -> None:
        """Close the file, the ring and the threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._ring is not None:
            self._ring.close()
            self._ring = None
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _aligned(nbytes: int) -> np.ndarray:
    """nbytes of host memory starting on a BLOCK boundary."""
    raw = np.empty(nbytes + BLOCK, np.uint8)
    skip = -raw.ctypes.data % BLOCK
    return raw[skip : skip + nbytes]


def _extents(starts: np.ndarray, size: int, most: int) -> list[tuple[int, int, int]]:
    """(first byte, end, bytes needed from the first) of block-aligned reads covering records at sorted `starts`,
    neighbours merged up to `most` bytes."""
    lo = starts - starts % BLOCK
    hi = -(-(starts + size) // BLOCK) * BLOCK
    out: list[list[int]] = []
    for a, b, s in zip(lo.tolist(), hi.tolist(), starts.tolist(), strict=True):
        if out and a <= out[-1][1] and b - out[-1][0] <= most:
            out[-1][1] = max(out[-1][1], b)
            out[-1][2] = s + size - out[-1][0]
        else:
            out.append([a, b, s + size - a])
    return [tuple(e) for e in out]
