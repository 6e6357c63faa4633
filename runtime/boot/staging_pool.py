"""Staging memory faulted in ahead of the upload, on a thread, while the boot imports torch and starts CUDA.

Fresh anonymous memory faults in slowly enough that making the mmap path's ring inside the upload shows in a
fresh process's upload phase (benchmarks/summaries/boot.md). `prefault` maps and populates the ring as one
region on a daemon thread; the upload's first slot page-locks the whole region in one cudaHostRegister (instead of one per
slot), every slot `take`s its piece, and `release` unlocks and unmaps the region after the boot.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Callable

from tfc.runtime.boot import cuda_start
from tfc.runtime.boot.pages import MAP_FAILED, libc

_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
_PROT = mmap.PROT_READ | mmap.PROT_WRITE


def map_populated(nbytes: int) -> int | None:
    """Private anonymous memory of nbytes, faulted in by the kernel (MAP_POPULATE); None if the map fails."""
    addr = libc().mmap(None, nbytes, _PROT, _FLAGS, -1, 0)
    return None if addr in (None, MAP_FAILED) else addr


class StagingPool:
    """`count` slots of `slot_bytes` in one region, mapped and faulted in by a daemon thread started at
    construction, and page-locked in one call by the first taker (one registration instead of one per slot)."""

    def __init__(self, slot_bytes: int, count: int) -> None:
        self.slot_bytes, self.count = slot_bytes, count
        self._base: int | None = None
        self._given = 0
        self._unlock: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._fill, name="tfc-staging-prefault", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        self._base = map_populated(self.slot_bytes * self.count)  # None (out of memory): slots map their own

    def take(self, nbytes: int, lock_pages: Callable[[int, int], Callable[[], None]]) -> int | None:
        """A faulted-in, page-locked slot of exactly nbytes (waiting for the thread to finish), or None: map one
        yourself. The first take page-locks the whole region with `lock_pages(addr, nbytes)` (returning its
        unlock); the pool owns the slots and frees them at `release`."""
        if nbytes != self.slot_bytes:
            return None
        self._thread.join()
        with self._lock:
            if self._base is None or self._given == self.count:
                return None
            if self._unlock is None:
                self._unlock = lock_pages(self._base, self.slot_bytes * self.count)
            self._given += 1
            return self._base + (self._given - 1) * self.slot_bytes

    def taken(self) -> int:
        """Slots handed out so far (after the thread has finished)."""
        self._thread.join()
        with self._lock:
            return self._given

    def release(self) -> int:
        """Unlock and unmap the region (every copy from its slots must have completed); returns how many slots
        no one took."""
        self._thread.join()
        with self._lock:
            base, unlock, self._base, self._unlock = self._base, self._unlock, None, None
        if base is None:
            return 0
        if unlock is not None:
            unlock()
        libc().munmap(base, self.slot_bytes * self.count)
        return self.count - self._given


_POOL: list[StagingPool] = []  # the process's pool while a boot runs (at most one)
_POOL_LOCK = threading.Lock()


def prefault(slot_bytes: int, count: int) -> StagingPool | None:
    """Start faulting in `count` slots of `slot_bytes` for the next upload; None when the process already has
    a pool (another boot's: one per process, so that boot releases it, and this one maps its own slots)."""
    with _POOL_LOCK:
        if _POOL:
            return None
        _POOL.append(StagingPool(slot_bytes, count))
        return _POOL[0]


def _current() -> StagingPool | None:
    """The process's pool, if a boot has one."""
    with _POOL_LOCK:
        return _POOL[0] if _POOL else None


def take(nbytes: int, lock_pages: Callable[[int, int], Callable[[], None]]) -> int | None:
    """A prefaulted, page-locked slot of nbytes from the process's pool (which frees it at `release`), or None
    (no pool, another size, none left)."""
    pool = _current()
    return pool.take(nbytes, lock_pages) if pool else None


def note() -> str:
    """What the process's pool did, for the upload phase's note ("" without a pool)."""
    pool = _current()
    return f"staging prefaulted: {pool.taken()} of {pool.count} slots taken" if pool else ""


def release() -> int:
    """End the process's pool: unlock and unmap it; returns how many slots no upload took (0 without a pool)."""
    with _POOL_LOCK:
        pool = _POOL.pop() if _POOL else None
    return pool.release() if pool else 0


def wanted(device: str | None, method: str | None) -> bool:
    """Whether a boot on `device` with upload `method` may use the mmap path on a GPU (so prefaulting pays):
    on CUDA (runtime/cuda_start.uses_cuda), not a forced ring or register path."""
    if method not in (None, "auto", "mmap"):
        return False
    return cuda_start.uses_cuda(device)


__all__ = ["StagingPool", "map_populated", "note", "prefault", "release", "take", "wanted"]
