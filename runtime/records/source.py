"""Where an off-device segment's records come from: a table in host memory, or its image file through an LRU.

`gather(rows)` returns uint8 [n, record_bytes] of local rows (a step's, on the host, before the step runs);
`prefetch(rows)` starts reading rows a later step will want into the LRU (a no-op for a host table). A record
comes back with its file's bytes or not at all (`RecordReadError`).
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import numpy as np
from tfc.runtime.records.reader import RecordConfig, RecordFile, RecordReadError


class RecordSource(Protocol):
    """Records of one segment by local row."""

    rows: int
    record_bytes: int

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """uint8 [n, record_bytes] of local `rows`."""
        ...

    def prefetch(self, rows: np.ndarray) -> None:
        """Start reading `rows` for a later gather (nothing to do where records are in memory)."""
        ...

    def close(self) -> None:
        """Release files and threads."""
        ...


class TableRecords:
    """Records of a table held in host memory (the host tier: pinned on a GPU machine)."""

    def __init__(self, table: np.ndarray, where: str) -> None:
        if table.dtype != np.uint8 or table.ndim != 2:
            raise ValueError(
                f"{where}: a record table is uint8 [rows, record bytes], not {table.dtype}{table.shape}"
            )
        self.table, self.where = table, where
        self.rows, self.record_bytes = table.shape

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """uint8 [n, record_bytes] of local `rows`."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        if rows.size and (int(rows.min()) < 0 or int(rows.max()) >= self.rows):
            raise RecordReadError(f"{self.where}: records outside [0, {self.rows})")
        return self.table[rows]

    def prefetch(self, rows: np.ndarray) -> None:
        """Nothing: every record is in memory."""

    def close(self) -> None:
        """Nothing to release (the host tier owns the table)."""


class RecordCache:
    """An LRU of `capacity` records of `record_bytes` in one slab; thread-safe."""

    def __init__(self, capacity: int, record_bytes: int) -> None:
        self.capacity = capacity
        self._slab = np.empty((capacity, record_bytes), np.uint8)
        self._where: OrderedDict[int, int] = OrderedDict()  # row -> slab slot, least recent first
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def take(self, rows: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Copy the cached ones of distinct `rows` into `out`; the mask of those found."""
        found = np.zeros(rows.size, bool)
        with self._lock:
            for i, row in enumerate(rows.tolist()):
                slot = self._where.get(row)
                if slot is not None:
                    self._where.move_to_end(row)
                    out[i] = self._slab[slot]
                    found[i] = True
            hits = int(found.sum())
            self.hits += hits
            self.misses += rows.size - hits
        return found

    def has(self, rows: np.ndarray) -> np.ndarray:
        """The mask of `rows` cached (their recency unchanged)."""
        with self._lock:
            return np.fromiter((r in self._where for r in rows.tolist()), bool, rows.size)

    def put(self, rows: np.ndarray, records: np.ndarray) -> None:
        """Keep records of distinct `rows`, the least recently used leaving first (at most the last `capacity`)."""
        if not self.capacity:
            return
        with self._lock:
            for row, record in zip(rows.tolist()[-self.capacity :], records[-self.capacity :], strict=True):
                slot = self._where.pop(row, None)
                if slot is None:
                    slot = (
                        len(self._where)
                        if len(self._where) < self.capacity
                        else self._where.popitem(False)[1]
                    )
                self._where[row] = slot
                self._slab[slot] = record

    def __len__(self) -> int:
        return len(self._where)


class FileRecords:
    """Records read in place from the image file (the NVMe tier) through a per-segment LRU, with prefetch."""

    def __init__(self, file: RecordFile, config: RecordConfig = RecordConfig()) -> None:
        self.file = file
        self.rows, self.record_bytes = file.rows, file.record_bytes
        self.cache = RecordCache(config.cache_records, file.record_bytes)
        self._ahead = ThreadPoolExecutor(1, thread_name_prefix="tfc-prefetch")
        self._pending: Future | None = None

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """uint8 [n, record_bytes] of local `rows`: cached ones from the LRU, the rest read (then cached)."""
        self._settle()  # the rows a prefetch is reading are likely this call's
        rows = np.asarray(rows, np.int64).reshape(-1)
        want, inverse = np.unique(rows, return_inverse=True)
        got = np.empty((want.size, self.record_bytes), np.uint8)
        found = self.cache.take(want, got)
        if not found.all():
            missing = want[~found]
            got[~found] = records = self.file.read(missing)
            self.cache.put(missing, records)
        return got[inverse]

    def prefetch(self, rows: np.ndarray) -> None:
        """Read the uncached ones of `rows` into the LRU on a thread (a failure is left for the gather to meet)."""
        rows = np.unique(np.asarray(rows, np.int64).reshape(-1))
        rows = rows[~self.cache.has(rows)][: self.cache.capacity]
        if rows.size:
            self._settle()
            self._pending = self._ahead.submit(self._fill, rows)

    def _fill(self, rows: np.ndarray) -> None:
        # a failure is the gather's to meet: it reads these rows again and fails its request
        with contextlib.suppress(RecordReadError):
            self.cache.put(rows, self.file.read(rows))

    def _settle(self) -> None:
        if self._pending is not None:
            self._pending.result()
            self._pending = None

    def close(self) -> None:
        """Wait for a prefetch, then close the file."""
        self._ahead.shutdown(wait=True)
        self.file.close()
