"""Warm upload: copy threads move the read-only mmap of the rank's files through a pinned staging ring.

Copy threads take slot-sized pieces from one queue. For each piece a thread waits until one of its own slots
is free (the event recorded after that slot's last host-to-device copy has completed), copies the piece with
`memmove` (ctypes releases the GIL), drops the piece's page tables again (MADV_DONTNEED: the page cache keeps
the pages, and the final munmap has nothing left to tear down), then issues the asynchronous host-to-device
copy on its own stream. Host copies and PCIe transfers of different slots run at once.

Slots are anonymous memory page-locked with cudaHostRegister, taken from the slots the boot faulted in ahead
(runtime/boot/staging_pool.py) when there are any, else made when first used (so the first copies start
before the whole ring exists). The upload reports, summed over the threads, the seconds spent staging,
waiting for a slot, copying and issuing. `copier="native"` (the default where it can run, WARM_NATIVE) runs
the same loop on C threads (runtime/boot/upload_native.py) with all slots made up front: no interpreter lock
per piece, so a ring small enough for the host's last-level cache pays. The options measured slower and dropped
(per-piece prefault, one issuer thread, torch's pinned slots, ...) are in git (benchmarks/boot_variants.py at
e78a622); the numbers are in benchmarks/summaries/boot.md.
"""

from __future__ import annotations

import ctypes
import functools
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfc.runtime.boot import staging_pool
from tfc.runtime.boot import upload_files as uf
from tfc.runtime.boot.arena import DeviceArena
from tfc.runtime.boot.pages import MADV_DONTNEED, libc

COPIERS = ("python", "native")
PAGE = uf.PAGE
_copy = ctypes.memmove  # a ctypes foreign call: the GIL is released while it runs


@dataclass(frozen=True)
class MmapStaging:
    """The mmap path's staging ring: copy threads, slots per thread and their size, and who runs the loop."""

    threads: int
    slot_bytes: int = 8 << 20
    slots_per_thread: int = 2
    copier: str = "python"  # Python threads, or C threads (runtime/boot/upload_native.py)

    def __post_init__(self) -> None:
        if self.copier not in COPIERS:
            raise uf.UploadError(f"mmap upload copier {self.copier!r} is not one of {COPIERS}")
        if self.threads < 1 or self.slots_per_thread < 1 or self.slot_bytes < PAGE or self.slot_bytes % PAGE:
            raise uf.UploadError(
                f"mmap upload needs at least one thread, slot and whole page per slot: {self}"
            )
        if self.copier == "native" and self.slots_per_thread > 64:
            raise uf.UploadError("the native copier takes at most 64 slots per thread")

    @property
    def ring_bytes(self) -> int:
        """Staging bytes when every slot is in use."""
        return self.threads * self.slots_per_thread * self.slot_bytes

    def describe(self) -> str:
        """One line for the phase note: threads, slots, ring size."""
        return (
            f"{self.threads} {'C ' if self.copier == 'native' else ''}threads x {self.slot_bytes >> 20} MiB x "
            f"{self.slots_per_thread} slots ({self.ring_bytes >> 20} MiB staging)"
        )

    def upload(self, arena: DeviceArena, files: uf.RankFiles, tick: uf.Progress) -> MmapTimes:
        """Fill `arena` through this ring (upload_mmap)."""
        return upload_mmap(arena, files, self, tick)


@dataclass
class MmapTimes:
    """When the last piece left the mapping, and seconds per step summed over the copy threads."""

    read_done: float = 0.0
    first_copy: float = 0.0  # when the first piece started leaving the mapping (perf_counter)
    staging: float = 0.0  # allocating and pinning slots
    pool: float = 0.0  # ... of which taking a prefaulted slot (waiting for the pool's fill and page lock)
    wait: float = 0.0  # waiting for a slot's previous host-to-device copy
    copy: float = 0.0  # memmove out of the mapping (with the madvise calls)
    issue: float = 0.0  # issuing the host-to-device copies

    def steps(self) -> dict[str, float]:
        """The summed steps, rounded, for a report."""
        return {k: round(getattr(self, k), 4) for k in ("staging", "pool", "wait", "copy", "issue")}

    def add(self, other: MmapTimes) -> None:
        """Add another thread's summed steps to these."""
        for k in ("staging", "pool", "wait", "copy", "issue"):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def cpu_threads() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# The Python copy loop's best ring on the H200 host, the warm default where the native copier cannot run.
WARM_MMAP = MmapStaging(threads=16)
# The warm default: the loop on C threads with a 96 MiB ring that the host's last-level cache holds while the
# DMA reads it (benchmarks/summaries/boot.md).
WARM_NATIVE = MmapStaging(threads=12, slot_bytes=4 << 20, copier="native")


@functools.cache
def native_ready() -> str:
    """Why the native copier cannot run in this process (the CUDA driver must load and the loop build), or the
    empty string when it can (asked once per process; the build is cached on disk)."""
    from tfc.runtime.boot import upload_native

    try:
        upload_native.CudaDriver()
        upload_native.library()
    except uf.UploadError as e:
        return str(e)
    return ""


def copier_note(cfg: MmapStaging) -> str:
    """The upload note's word on the copier: why Python copy threads run ("" where they are not the fallback)."""
    if cfg.copier != "python" or not native_ready():
        return ""
    return f"Python copy threads: {native_ready()}"


def staging_for(threads: int | None = None, copier: str | None = None) -> MmapStaging:
    """The warm default (WARM_NATIVE where the native copier can run, else WARM_MMAP; or the copier asked for)
    with `threads` copy threads (default: the default's, at most the CPU count)."""
    native = copier == "native" or (copier is None and not native_ready())
    base = WARM_NATIVE if native else WARM_MMAP
    return MmapStaging(threads or min(base.threads, cpu_threads()), base.slot_bytes, base.slots_per_thread,
                       copier or base.copier)  # fmt: skip


def lock_staging(addr: int, nbytes: int) -> Callable[[], None]:
    """Page-lock [addr, addr + nbytes) for DMA (cudaHostRegister, portable); returns its unlock."""
    registrar = uf.Registrar()
    registrar.register(addr, nbytes, uf.REGISTER_PORTABLE)
    return lambda: registrar.unregister(addr)


class StagingSlot:
    """One page-locked staging buffer: its address and a uint8 tensor over it."""

    def __init__(self, nbytes: int) -> None:
        import torch

        self.nbytes, self.mapped, self.unlock = nbytes, 0, None
        t0 = time.perf_counter()
        addr = staging_pool.take(nbytes, lock_staging)  # faulted in and locked ahead: the pool frees it
        self.take_s = time.perf_counter() - t0
        if addr is None:
            addr = staging_pool.map_populated(nbytes)
            if addr is None:
                raise uf.UploadError(
                    f"cannot map {nbytes} bytes of staging: {os.strerror(ctypes.get_errno())}"
                )
            self.mapped = addr
            try:
                self.unlock = lock_staging(addr, nbytes)
            except BaseException:
                libc().munmap(addr, nbytes)
                self.mapped = 0
                raise
        self.addr = addr
        self.tensor = torch.frombuffer(uf.host_bytes(addr, nbytes), dtype=torch.uint8)

    def free(self) -> None:
        """Give the memory back (after every copy from it has completed; a pool's slot goes back with the pool)."""
        self.tensor = None
        if self.unlock is not None:
            self.unlock()
            self.unlock = None
        if self.mapped:
            libc().munmap(self.mapped, self.nbytes)
            self.mapped = 0


def mapped_pieces(
    arena: DeviceArena, files: uf.RankFiles, slot_bytes: int
) -> tuple[list[tuple[int, Any, int, int, int]], dict[Any, tuple[int, int]]]:
    """The slot-sized pieces and each file's (address, size) mapping, every piece inside its file."""
    pieces = uf.pieces(arena, slot_bytes)
    bases = {p: files.map(p) for p in sorted({pc[1] for pc in pieces})}  # before any thread starts
    for _, path, foff, _, n in pieces:
        if foff + n > bases[path][1]:  # reading past the end of a mapping is SIGBUS, not an error
            raise uf.UploadError(f"{path} ends at {bases[path][1]}, before the {n} bytes at {foff}")
    return pieces, bases


def drop_pages(addr: int, n: int) -> None:
    """MADV_DONTNEED the whole pages of [addr, addr + n) (the page cache keeps them; the page tables go)."""
    lo, hi = -(-addr // PAGE) * PAGE, (addr + n) // PAGE * PAGE
    if hi > lo:
        libc().madvise(lo, hi - lo, MADV_DONTNEED)


def upload_mmap(arena: DeviceArena, files: uf.RankFiles, cfg: MmapStaging, tick: uf.Progress) -> MmapTimes:
    """Fill `arena` through the staging ring; returns when the last piece left the mapping, and the steps."""
    pieces, bases = mapped_pieces(arena, files, cfg.slot_bytes)
    if cfg.copier == "native":
        from tfc.runtime.boot.upload_native import upload_native

        return upload_native(arena, pieces, bases, cfg, tick)
    return _upload_threads(arena, pieces, bases, cfg, tick)


def _upload_threads(
    arena: DeviceArena, pieces: list, bases: dict, cfg: MmapStaging, tick: uf.Progress
) -> MmapTimes:
    """The copy loop on Python threads, each with its own stream and slots (made when first used)."""
    import torch

    device = arena.device
    work = uf.queue_of(pieces)
    threads = min(cfg.threads, max(1, len(pieces)))
    per = cfg.slots_per_thread
    stop = threading.Event()
    last_copy = [0.0] * threads
    spent = [MmapTimes() for _ in range(threads)]
    slots: list[list[StagingSlot]] = [[] for _ in range(threads)]

    def copier(i: int) -> None:
        mine, t, stream = slots[i], spent[i], None
        try:
            torch.cuda.set_device(device)
            stream = torch.cuda.Stream(device=device)
            # Blocking events: a waiting thread sleeps rather than spin on a core the copies need.
            events = [torch.cuda.Event(blocking=True) for _ in range(per)]
            k = 0
            with torch.cuda.stream(stream):
                while not stop.is_set():
                    try:
                        ci, path, foff, coff, n = work.get_nowait()
                    except queue.Empty:
                        break
                    t0 = time.perf_counter()
                    if k < len(mine):
                        events[k].synchronize()  # the slot's previous copy has left it
                    t1 = time.perf_counter()
                    t.wait += t1 - t0
                    if k == len(mine):
                        mine.append(StagingSlot(cfg.slot_bytes))
                        t.staging += time.perf_counter() - t1
                        t.pool += mine[k].take_s
                        t1 = time.perf_counter()
                    if not t.first_copy:
                        t.first_copy = t1
                    src = bases[path][0] + foff
                    _copy(mine[k].addr, src, n)
                    drop_pages(src, n)
                    last_copy[i] = t2 = time.perf_counter()
                    t.copy += t2 - t1
                    arena.chunks[ci][coff : coff + n].copy_(mine[k].tensor[:n], non_blocking=True)
                    events[k].record(stream)
                    t.issue += time.perf_counter() - t2
                    tick(n)
                    k = (k + 1) % per
        finally:
            if stream is not None:
                stream.synchronize()

    try:
        uf.run_workers(threads, copier, on_error=stop.set)
        torch.cuda.synchronize(device)
    finally:
        for mine in slots:
            for slot in mine:
                slot.free()
    starts = [t.first_copy for t in spent if t.first_copy]
    total = MmapTimes(read_done=max(last_copy) or time.perf_counter(), first_copy=min(starts, default=0.0))
    for t in spent:
        total.add(t)
    return total


__all__ = [
    "COPIERS",
    "WARM_MMAP",
    "WARM_NATIVE",
    "MmapStaging",
    "MmapTimes",
    "StagingSlot",
    "copier_note",
    "cpu_threads",
    "drop_pages",
    "lock_staging",
    "mapped_pieces",
    "native_ready",
    "staging_for",
    "upload_mmap",
]
