"""Warm upload: threads copy the read-only mmap of the rank's files into a pinned staging ring.

Copy threads take slot-sized pieces from one queue. For each piece a thread waits until one of its
own slots is free (the event recorded after that slot's last host-to-device copy has completed),
optionally pre-faults the piece's page tables in one call (MADV_POPULATE_READ, else MADV_WILLNEED),
copies the piece with `memmove` (ctypes releases the GIL), optionally drops the piece's page tables
again (MADV_DONTNEED: the page cache keeps the pages, and the final munmap has nothing left to tear
down), then has the asynchronous host-to-device copy issued: by itself on its own stream, or by one
issuer thread over a few streams. Host copies and PCIe transfers of different slots run at once.

Slots are allocated when first used (so the first copies start before the whole ring exists):
anonymous memory page-locked with cudaHostRegister (`register`; taken from the slots the boot faulted in
ahead, runtime/boot/staging_pool.py, when there are any), or torch's pinned allocator (`torch`).
The upload reports, summed over the threads, the seconds spent staging, waiting for a slot, copying
and issuing. `copier="native"` (the default where it can run, WARM_NATIVE) runs the same loop on C threads
(runtime/boot/upload_native.py) with all slots made up front: no interpreter lock per piece, so a ring small
enough for the host's last-level cache pays (boot_h200.md, runs 8-9). Variants measured slower on the H200
host and removed (benchmarks/boot_pipeline_h200.md): huge-page slots, threads bound to CPUs, threads that
page-lock the mapping and copy from it directly.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tfc.runtime.boot import staging_pool
from tfc.runtime.boot import upload as up
from tfc.runtime.boot.pages import MADV_DONTNEED, MADV_POPULATE_READ, MADV_WILLNEED, libc

PREFAULTS = ("none", "populate", "willneed")
ISSUERS = ("thread", "single")
PINNINGS = ("register", "torch")
COPIERS = ("python", "native")
PAGE = mmap.PAGESIZE
_copy = ctypes.memmove  # a ctypes foreign call: the GIL is released while it runs


@dataclass(frozen=True)
class MmapStaging:
    """How the mmap path stages: copy threads, slots per thread and their size, and the options."""

    threads: int
    slot_bytes: int = 8 << 20
    slots_per_thread: int = 2
    prefault: str = "none"  # page tables of a piece before copying it: none, populate or willneed
    drop: bool = True  # MADV_DONTNEED a piece's pages once copied
    issuer: str = "thread"  # who issues the host-to-device copies: each copy thread, or one thread
    streams: int = 2  # CUDA streams of the single issuer
    pinning: str = "register"  # how slots are page-locked: cudaHostRegister, or torch's allocator
    copier: str = (
        "python"  # who runs the copy loop: Python threads, or C threads (runtime/boot/upload_native.py)
    )

    @property
    def ring_bytes(self) -> int:
        """Staging bytes when every slot is in use."""
        return self.threads * self.slots_per_thread * self.slot_bytes

    def describe(self) -> str:
        """One line for the phase note: threads, slots, options."""
        who = "per thread" if self.issuer == "thread" else f"by one issuer on {self.streams} streams"
        return (
            f"{self.threads} {'C ' if self.copier == 'native' else ''}threads x {self.slot_bytes >> 20} MiB x "
            f"{self.slots_per_thread} slots ({self.ring_bytes >> 20} MiB {self.pinning}), prefault {self.prefault}"
            f"{', drop' if self.drop else ''}, copies issued {who}"
        )


@dataclass
class MmapTimes:
    """When the last piece left the mapping, and seconds per step summed over the copy threads."""

    read_done: float = 0.0
    first_copy: float = 0.0  # when the first piece started leaving the mapping (perf_counter)
    staging: float = 0.0  # allocating and pinning slots
    pool: float = 0.0  # ... of which taking a prefaulted slot (waiting for the pool's fill and page lock)
    wait: float = 0.0  # waiting for a slot's previous host-to-device copy
    copy: float = 0.0  # memmove out of the mapping (with the madvise calls)
    issue: float = 0.0  # issuing the host-to-device copies (or handing them to the issuer)

    def steps(self) -> dict[str, float]:
        """The summed steps, rounded, for a report."""
        return {k: round(getattr(self, k), 4) for k in ("staging", "pool", "wait", "copy", "issue")}


def cpu_threads() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# The Python copy loop's best configuration on the H200 host (boot_h200.md, runs 3-7; boot_h200.py sweeps it):
# 16 x 8 MiB x 2, register, drop, per thread (0.59-0.73 s for 22 GB). The warm default where the native copier
# cannot run.
WARM_MMAP = MmapStaging(threads=16)
# The warm default: the copy loop on C threads with a 96 MiB ring (12 x 4 MiB x 2) that the host's 300 MiB
# last-level cache holds while the DMA reads it (boot_h200.md, runs 8-9: 0.52-0.58 s against 0.57-0.73 s for
# WARM_MMAP in the same runs; rings of 256 MiB measured slower; runs 10-11: 12 threads 0.480 / 0.444 s against
# 0.49-0.52 / 0.456-0.458 s for 16, without / with the staging prefaulted).
WARM_NATIVE = MmapStaging(threads=12, slot_bytes=4 << 20, copier="native")


@functools.cache
def native_ready() -> str:
    """Why the native copier cannot run in this process (the CUDA driver must load and the loop build), or the
    empty string when it can (asked once per process; the build is cached on disk)."""
    from tfc.runtime.boot import upload_native

    try:
        _CudaDriver()
        upload_native.library()
    except up.UploadError as e:
        return str(e)
    return ""


def copier_note(cfg: MmapStaging, asked: bool) -> str:
    """The upload note's word on the copier: why Python copy threads run where the native copier was not asked
    for and cannot run here ("" otherwise)."""
    if cfg.copier != "python" or asked or not native_ready():
        return ""
    return f"Python copy threads: {native_ready()}"


def staging_for(
    threads: int | None = None,
    slot_bytes: int | None = None,
    slots_per_thread: int | None = None,
    **options: Any,
) -> MmapStaging:
    """The warm default (WARM_NATIVE where the native copier can run, else WARM_MMAP; the copier asked for, or
    options only the Python loop has, pick their own) with whatever was asked for instead (threads default to at
    most the CPU count)."""
    copier = options.get("copier")
    python_only = options.get("prefault", "none") != "none" or options.get("issuer", "thread") != "thread"
    native = copier == "native" or (copier is None and not python_only and not native_ready())
    base = WARM_NATIVE if native else WARM_MMAP
    fields = {"threads": threads or min(base.threads, cpu_threads())}
    fields |= {"slot_bytes": slot_bytes, "slots_per_thread": slots_per_thread, **options}
    unknown = set(fields) - set(MmapStaging.__dataclass_fields__)
    if unknown:
        raise up.UploadError(f"unknown mmap upload options {sorted(unknown)}")
    cfg = replace(base, **{k: v for k, v in fields.items() if v is not None})
    for name, value, allowed in (
        ("prefault", cfg.prefault, PREFAULTS),
        ("issuer", cfg.issuer, ISSUERS),
        ("pinning", cfg.pinning, PINNINGS),
        ("copier", cfg.copier, COPIERS),
    ):
        if value not in allowed:
            raise up.UploadError(f"mmap upload {name} {value!r} is not one of {allowed}")
    if cfg.threads < 1 or cfg.slots_per_thread < 1 or cfg.streams < 1 or cfg.slot_bytes < PAGE:
        raise up.UploadError(f"mmap upload needs at least one thread, slot, stream and page per slot: {cfg}")
    if cfg.copier == "native" and (
        cfg.prefault != "none" or cfg.issuer != "thread" or cfg.slots_per_thread > 64
    ):
        raise up.UploadError(
            "the native copier issues per thread, without prefault, with at most 64 slots each"
        )
    return replace(cfg, slot_bytes=cfg.slot_bytes - cfg.slot_bytes % PAGE)


class _Advice:
    """The per-piece madvise calls: pre-fault before the copy, drop after it."""

    def __init__(self, prefault: str, drop: bool) -> None:
        self.lib = libc()
        self.advice = {"none": 0, "populate": MADV_POPULATE_READ, "willneed": MADV_WILLNEED}[prefault]
        self.drop = drop

    def before(self, addr: int, n: int) -> None:
        if not self.advice:
            return
        start = addr - addr % PAGE
        if self.lib.madvise(start, addr + n - start, self.advice) != 0 and self.advice == MADV_POPULATE_READ:
            self.advice = MADV_WILLNEED  # a kernel before 5.14: ask for read-ahead instead

    def after(self, addr: int, n: int) -> None:
        lo, hi = -(-addr // PAGE) * PAGE, (addr + n) // PAGE * PAGE  # whole pages only
        if self.drop and hi > lo:
            self.lib.madvise(lo, hi - lo, MADV_DONTNEED)


def _lock_staging(addr: int, nbytes: int) -> Callable[[], None]:
    """Page-lock [addr, addr + nbytes) for DMA (cudaHostRegister, portable); returns its unlock."""
    registrar = up._Registrar()
    registrar.register(addr, nbytes, up.REGISTER_PORTABLE)
    return lambda: registrar.unregister(addr)


class _Slot:
    """One page-locked staging buffer: its address and a uint8 tensor over it."""

    def __init__(self, nbytes: int, pinning: str) -> None:
        import torch

        self.nbytes, self.pinning, self.mapped, self.unlock, self.take_s = nbytes, pinning, 0, None, 0.0
        if pinning == "torch":
            self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            self.addr = self.tensor.data_ptr()
            return
        t0 = time.perf_counter()
        addr = staging_pool.take(nbytes, _lock_staging)  # faulted in and locked ahead: the pool frees it
        self.take_s = time.perf_counter() - t0
        if addr is None:
            addr = staging_pool.map_populated(nbytes)
            if addr is None:
                raise up.UploadError(
                    f"cannot map {nbytes} bytes of staging: {os.strerror(ctypes.get_errno())}"
                )
            self.mapped = addr
            try:
                self.unlock = _lock_staging(addr, nbytes)
            except BaseException:
                libc().munmap(addr, nbytes)
                self.mapped = 0
                raise
        self.addr = addr
        self.tensor = torch.frombuffer(up._host_bytes(addr, nbytes), dtype=torch.uint8)

    def free(self) -> None:
        """Give the memory back (after every copy from it has completed; a pool's slot goes back with the pool)."""
        self.tensor = None
        if self.unlock is not None:
            self.unlock()
            self.unlock = None
        if self.mapped:
            libc().munmap(self.mapped, self.nbytes)
            self.mapped = 0


def _mapped_pieces(
    arena: up.DeviceArena, files: up._Files, slot_bytes: int
) -> tuple[list[tuple[int, Any, int, int, int]], dict[Any, tuple[int, int]]]:
    """The slot-sized pieces and each file's (address, size) mapping, every piece inside its file."""
    pieces = up._pieces(arena, slot_bytes)
    bases = {p: files.map(p) for p in sorted({pc[1] for pc in pieces})}  # before any thread starts
    for _, path, foff, _, n in pieces:
        if foff + n > bases[path][1]:  # reading past the end of a mapping is SIGBUS, not an error
            raise up.UploadError(f"{path} ends at {bases[path][1]}, before the {n} bytes at {foff}")
    return pieces, bases


class _CudaDriver:
    """The libcuda calls the native copier makes or needs set up (the driver API: each of its threads sets the
    device's primary context, the one torch's runtime uses)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise up.UploadError("the native copier needs the CUDA driver (libcuda.so.1)") from e

    def _addr(self, name: str) -> int:
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value or 0

    def calls(self) -> Any:
        from tfc.runtime.boot.upload_native import Driver

        return Driver(self._addr("cuCtxSetCurrent"), self._addr("cuMemcpyHtoDAsync_v2"),
                      self._addr("cuEventRecord"), self._addr("cuEventSynchronize"))  # fmt: skip

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise up.UploadError(f"{what} failed with CUDA driver error {code}")

    def primary_context(self, index: int) -> tuple[int, Callable[[], None]]:
        """The device's primary context, current on this thread too; returns it and its release."""
        dev, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return ctx.value or 0, lambda: self.lib.cuDevicePrimaryCtxRelease_v2(dev)

    def events(self, n: int) -> list[int]:
        """n events that a waiting thread sleeps on (blocking sync, no timing)."""
        out = []
        for _ in range(n):
            ev = ctypes.c_void_p()
            self.check(self.lib.cuEventCreate(ctypes.byref(ev), 0x1 | 0x2), "cuEventCreate")
            out.append(ev.value or 0)
        return out

    def destroy(self, events: list[int]) -> None:
        for ev in events:
            self.lib.cuEventDestroy_v2(ctypes.c_void_p(ev))


def _upload_native(
    arena: up.DeviceArena, pieces: list, bases: dict, cfg: MmapStaging, tick: Callable[[int], None]
) -> MmapTimes:
    """The same ring with the copy loop on C threads (runtime/boot/upload_native.py): slots made up front."""
    import numpy as np
    import torch
    from tfc.runtime.boot import upload_native

    rows = np.array([(bases[path][0] + foff, arena.chunks[ci].data_ptr() + coff, n)
                     for ci, path, foff, coff, n in pieces], dtype=np.uint64).reshape(-1, 3)  # fmt: skip
    threads = min(cfg.threads, max(1, len(pieces)))
    cuda = _CudaDriver()
    device = torch.device(arena.device)
    torch.cuda.set_device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    streams = [torch.cuda.Stream(device=device) for _ in range(threads)]
    t0 = time.perf_counter()
    slots: list[_Slot] = []
    ctx, release = cuda.primary_context(index)
    events: list[int] = []
    try:
        for _ in range(threads * cfg.slots_per_thread):  # one by one: a failure frees those already made
            slots.append(_Slot(cfg.slot_bytes, cfg.pinning))
        events = cuda.events(len(slots))
        t1 = time.perf_counter()
        steps = upload_native.stage(rows, [s.addr for s in slots], threads, [s.cuda_stream for s in streams],
                                    events, cuda.calls(), ctx, cfg.drop, tick)  # fmt: skip
    finally:
        cuda.destroy(events)
        for slot in slots:
            slot.free()
        release()
    return MmapTimes(read_done=time.perf_counter(), first_copy=t1, staging=t1 - t0,
                     pool=sum(s.take_s for s in slots), wait=steps.wait, copy=steps.copy, issue=steps.issue)  # fmt: skip


def upload_mmap(
    arena: up.DeviceArena, files: up._Files, cfg: MmapStaging, tick: Callable[[int], None]
) -> MmapTimes:
    """Fill `arena` through the staging ring; returns when the last piece left the mapping, and the steps."""
    import torch

    device = arena.device
    pieces, bases = _mapped_pieces(arena, files, cfg.slot_bytes)
    if cfg.copier == "native":
        return _upload_native(arena, pieces, bases, cfg, tick)
    work = up._queue_of(pieces)
    threads = min(cfg.threads, max(1, len(pieces)))
    advice = _Advice(cfg.prefault, cfg.drop)
    stop = threading.Event()
    ready: queue.SimpleQueue = queue.SimpleQueue()  # (thread, slot, chunk, offset, length); None: done
    back = [queue.SimpleQueue() for _ in range(threads)]  # (slot, event after its last copy or None)
    last_copy = [0.0] * threads
    spent = [MmapTimes() for _ in range(threads)]
    slots: list[list[_Slot]] = [[] for _ in range(threads)]

    def copier(i: int) -> None:
        mine, own, stream, t = slots[i], cfg.issuer == "thread", None, spent[i]
        try:
            for k in range(cfg.slots_per_thread):
                back[i].put((k, None))
            torch.cuda.set_device(device)
            if own:
                stream = torch.cuda.Stream(device=device)
                events = [torch.cuda.Event(blocking=True) for _ in range(cfg.slots_per_thread)]
            with torch.cuda.stream(stream) if own else contextlib.nullcontext():
                while not stop.is_set():
                    try:
                        ci, path, foff, coff, n = work.get_nowait()
                    except queue.Empty:
                        break
                    t0 = time.perf_counter()
                    k, event = back[i].get()
                    if event is not None:
                        # Blocking events: a waiting thread sleeps rather than spin on a core the copies need.
                        event.synchronize()  # the slot's previous copy has left it
                    t1 = time.perf_counter()
                    t.wait += t1 - t0
                    if k == len(mine):
                        mine.append(_Slot(cfg.slot_bytes, cfg.pinning))
                        t.staging += time.perf_counter() - t1
                        t.pool += mine[k].take_s
                        t1 = time.perf_counter()
                    if not t.first_copy:
                        t.first_copy = t1
                    src = bases[path][0] + foff
                    advice.before(src, n)
                    _copy(mine[k].addr, src, n)
                    advice.after(src, n)
                    last_copy[i] = t2 = time.perf_counter()
                    t.copy += t2 - t1
                    if own:
                        arena.chunks[ci][coff : coff + n].copy_(mine[k].tensor[:n], non_blocking=True)
                        events[k].record(stream)
                        back[i].put((k, events[k]))
                    else:
                        ready.put((i, k, ci, coff, n))
                    t.issue += time.perf_counter() - t2
                    tick(n)
        finally:
            if stream is not None:
                stream.synchronize()
            if not own:
                ready.put(None)

    def issuer() -> None:
        streams: list[Any] = []
        events: dict[tuple[int, int], Any] = {}
        left, j, failure = threads, 0, None
        try:
            torch.cuda.set_device(device)
            streams = [torch.cuda.Stream(device=device) for _ in range(cfg.streams)]
        except Exception as e:
            failure = e
            stop.set()
        while left:
            item = ready.get()
            if item is None:
                left -= 1
                continue
            i, k, ci, coff, n = item
            event = None
            if failure is None:
                try:
                    stream = streams[j % len(streams)]
                    j += 1
                    with torch.cuda.stream(stream):
                        arena.chunks[ci][coff : coff + n].copy_(slots[i][k].tensor[:n], non_blocking=True)
                    event = events.get((i, k))
                    if event is None:
                        event = events[i, k] = torch.cuda.Event(blocking=True)
                    event.record(stream)
                except Exception as e:
                    failure = e
                    stop.set()
            back[i].put((k, event))  # always answer: a copy thread waiting for a slot must not hang
        for s in streams:
            s.synchronize()
        if failure is not None:
            raise failure

    def run(i: int) -> None:
        issuer() if i == threads else copier(i)

    try:
        up._run_workers(threads + (1 if cfg.issuer == "single" else 0), run, on_error=stop.set)
        torch.cuda.synchronize(device)
    finally:
        for mine in slots:
            for slot in mine:
                slot.free()
        if cfg.pinning == "torch":
            up.empty_host_cache(torch)  # the slots go back now, not at exit
    starts = [t.first_copy for t in spent if t.first_copy]
    total = MmapTimes(read_done=max(last_copy) or time.perf_counter(), first_copy=min(starts, default=0.0))
    for t in spent:
        for k in ("staging", "pool", "wait", "copy", "issue"):
            setattr(total, k, getattr(total, k) + getattr(t, k))
    return total
