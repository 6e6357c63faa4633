"""Fill a DeviceArena from the rank's files: pinned staging ring, mmap copy, registered mmap, or host copy.

* `auto` (the default): `mmap` when the page cache holds the image (a `mincore` probe), else `ring`.
* `mmap` (runtime/boot/upload_mmap.py): threads copy the read-only mapping into a pinned staging ring
  while the host-to-device copies of earlier slots run.
* `ring`: reader threads `preadv` file ranges into pinned staging slots and issue async
  host-to-device copies on per-thread CUDA streams; a slot is reused once its copy's event has
  completed, so reading and copying overlap.
* `register`: the files are mmapped read-only and page-locked window by window with
  `cudaHostRegister` (several threads ahead of the copier), each window copied asynchronously and
  unregistered once its copy finished.
* `host`: the arena lives in host memory (no CUDA): threads `preadv` straight into it.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfc.runtime.boot.arena import DeviceArena
from tfc.runtime.boot.pages import MAP_FAILED, libc, resident_fraction

from tfc.errors import TfcError

METHODS = ("auto", "ring", "mmap", "register", "host")
THREADS = 8  # readers or registration threads when not asked for (mmap: its own default)
PAGE = mmap.PAGESIZE
REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly
REGISTER_PORTABLE = 0x01  # cudaHostRegisterPortable


class UploadError(TfcError):
    """The bytes could not be moved into the arena (short file, refused registration, ...)."""


@dataclass(frozen=True)
class UploadReport:
    """What an upload moved and how long it took (read overlaps the copy)."""

    method: str
    device: str
    bytes: int
    seconds: float  # until every byte is resident in the arena
    read_seconds: float  # until the last byte was in host memory (read or registered)
    threads: int
    config: str = ""  # the staging chosen, and why
    staging_seconds: float = 0.0  # allocating staging, summed over the threads (overlaps the copies)
    steps: dict[str, float] = field(default_factory=dict)  # mmap: seconds per step, summed over threads

    @property
    def gbps(self) -> float:
        """Bytes per second over the whole upload, in GB/s (1e9)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


Progress = Callable[[int], None]


# Ring staging measured fastest on the H200 host (benchmarks/boot_h200_run1.md): many small slots when the
# image is in the page cache, a few large reads in flight when it comes from disk.
WARM_RING = (4 << 20, 4)  # 8 threads x 4 MiB x 4: 0.925 s for 22 GB warm
COLD_RING = (64 << 20, 2)  # 8 threads x 64 MiB x 2: 1.06x the disk floor cold
WARM_FRACTION = 0.9


def upload(
    arena: DeviceArena,
    method: str | None = None,
    threads: int | None = None,
    slot_bytes: int | None = None,
    slots_per_thread: int | None = None,
    window_bytes: int = 256 << 20,
    progress: Progress | None = None,
    **mmap_options: Any,
) -> UploadReport:
    """Fill `arena` from its plan's files with `method` (host for a CPU arena, auto by default).

    `auto` takes `mmap` when the page cache holds the image and `ring` otherwise; without
    `slot_bytes`, the ring picks its staging by the same probe. `mmap_options` are the fields of
    `upload_mmap.MmapStaging` (prefault, drop, issuer, streams, pinning, copier).
    """
    method = method or "auto"
    if method not in METHODS:
        raise UploadError(f"upload method {method!r} is not one of {METHODS}")
    if arena.device.type == "cpu":
        if method not in ("auto", "host"):
            raise UploadError(
                f"upload method {method!r} needs a CUDA device; a CPU arena takes plain host copies"
            )
        method = "host"
    if method == "host" and arena.device.type != "cpu":
        raise UploadError("upload method 'host' needs a CPU arena")
    if threads is not None and threads < 1:
        raise UploadError(f"upload needs at least one thread, not {threads}")
    tick = progress or (lambda n: None)
    t0 = time.perf_counter()
    notes = []
    resident = None
    if method == "auto" or (method == "ring" and slot_bytes is None):
        resident = resident_fraction(sorted({c.path for c in arena.plan.chunks}))
    if method == "auto":
        method = "mmap" if resident >= WARM_FRACTION else "ring"
        notes.append(f"auto: {resident:.0%} of the image in page cache")
    if method == "mmap":
        from tfc.runtime.boot.upload_mmap import copier_note, staging_for, upload_mmap

        cfg = staging_for(threads, slot_bytes, slots_per_thread, **mmap_options)
        threads = cfg.threads
        notes[:0] = [cfg.describe(), *filter(None, [copier_note(cfg, "copier" in mmap_options)])]
    elif mmap_options:
        raise UploadError(f"{sorted(mmap_options)} only apply to upload method 'mmap', not {method!r}")
    elif method == "ring" and slot_bytes is None:
        slot_bytes, per = WARM_RING if resident >= WARM_FRACTION else COLD_RING
        slots_per_thread = slots_per_thread or per
        notes.insert(0, f"{slot_bytes >> 20} MiB x {slots_per_thread} slots")
        if len(notes) == 1:
            notes.append(f"{resident:.0%} of the image in page cache")
    threads = threads or THREADS
    slot_bytes = slot_bytes or (16 << 20)
    slots_per_thread = slots_per_thread or 2
    staging, steps = 0.0, {}
    with _Files(arena) as files:
        if method == "host":
            read_done = _upload_host(arena, files, threads, slot_bytes, tick)
        elif method == "mmap":
            times = upload_mmap(arena, files, cfg, tick)
            read_done, staging, steps = times.read_done, times.staging, times.steps()
            if times.first_copy:  # wall seconds before the first byte left the mapping (not summed)
                steps["ramp"] = round(times.first_copy - t0, 4)
        elif method == "ring":
            read_done = _upload_ring(arena, files, threads, slot_bytes, slots_per_thread, tick)
        else:
            read_done = _upload_register(arena, files, threads, window_bytes, tick)
    t1 = time.perf_counter()
    config = "; ".join(notes)
    return UploadReport(
        method, str(arena.device), arena.nbytes, t1 - t0, read_done - t0, threads, config, staging, steps
    )


class _Files:
    """Open file descriptors (and, for register, read-only maps) of the arena's files."""

    def __init__(self, arena: DeviceArena) -> None:
        self.paths = sorted({c.path for c in arena.plan.chunks})
        self.fds: dict[Path, int] = {}
        self.maps: dict[Path, tuple[int, int]] = {}

    def __enter__(self) -> _Files:
        for p in self.paths:
            self.fds[p] = os.open(p, os.O_RDONLY)
        return self

    def map(self, path: Path) -> tuple[int, int]:
        """(address, size) of a read-only shared mapping of the whole file (libc mmap: an address
        is what cudaHostRegister needs, and Python's mmap hides it for read-only maps)."""
        if path not in self.maps:
            size = os.fstat(self.fds[path]).st_size
            addr = libc().mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, self.fds[path], 0)
            if addr in (None, MAP_FAILED):
                raise UploadError(f"cannot map {path} ({size} bytes): {os.strerror(ctypes.get_errno())}")
            self.maps[path] = (addr, size)
        return self.maps[path]

    def __exit__(self, *exc: object) -> None:
        for addr, size in self.maps.values():
            libc().munmap(addr, size)
        for fd in self.fds.values():
            os.close(fd)


def _host_bytes(addr: int, n: int) -> Any:
    """A writable ctypes byte array over host memory (a buffer for preadv and torch.frombuffer)."""
    return (ctypes.c_char * n).from_address(addr)


def _pieces(arena: DeviceArena, piece_bytes: int) -> list[tuple[int, Path, int, int, int]]:
    """(chunk index, file, file offset, chunk offset, length) of every slot-sized piece."""
    out = []
    for ci, chunk in enumerate(arena.plan.chunks):
        for off in range(0, chunk.nbytes, piece_bytes):
            n = min(piece_bytes, chunk.nbytes - off)
            out.append((ci, chunk.path, chunk.offset + off, off, n))
    return out


def _pread_into(fd: int, buf: memoryview, offset: int, path: Path) -> None:
    """Fill `buf` from `offset`, looping over short reads; a file that ends early is an error."""
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n <= 0:
            raise UploadError(f"{path} ends at {offset + done}, before the {len(buf)} bytes at {offset}")
        done += n


def _run_workers(n: int, work: Callable[[int], None], on_error: Callable[[], None] | None = None) -> None:
    """Run `work(i)` on n threads; after all have stopped, raise the first failure as one typed line.

    `on_error` runs in the failing thread (to tell the others to stop).
    """
    errors: list[BaseException] = []

    def wrapped(i: int) -> None:
        try:
            work(i)
        except BaseException as e:
            errors.append(e)
            if on_error is not None:
                on_error()

    pool = [threading.Thread(target=wrapped, args=(i,), daemon=True) for i in range(n)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if errors:
        first = errors[0]
        if isinstance(first, TfcError) or not isinstance(first, Exception):
            raise first
        lines = str(first).strip().splitlines() or [""]
        raise UploadError(f"upload thread failed: {type(first).__name__}: {lines[0]}") from first


def _queue_of(items: list) -> queue.SimpleQueue:
    q: queue.SimpleQueue = queue.SimpleQueue()
    for it in items:
        q.put(it)
    return q


def _upload_host(arena: DeviceArena, files: _Files, threads: int, piece_bytes: int, tick: Progress) -> float:
    work = _queue_of(_pieces(arena, max(piece_bytes, 1 << 20)))
    views = [memoryview(_host_bytes(c.data_ptr(), c.numel())).cast("B") for c in arena.chunks]

    def reader(_: int) -> None:
        while True:
            try:
                ci, path, foff, coff, n = work.get_nowait()
            except queue.Empty:
                return
            _pread_into(files.fds[path], views[ci][coff : coff + n], foff, path)
            tick(n)

    _run_workers(min(threads, max(1, work.qsize())), reader)
    return time.perf_counter()


def _upload_ring(
    arena: DeviceArena, files: _Files, threads: int, slot_bytes: int, per_thread: int, tick: Progress
) -> float:
    import torch

    device = arena.device
    work = _queue_of(_pieces(arena, slot_bytes))
    threads = min(threads, max(1, work.qsize()))
    last_read = [0.0] * threads

    def reader(i: int) -> None:
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        slots = [torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(per_thread)]
        views = [memoryview(_host_bytes(s.data_ptr(), s.numel())).cast("B") for s in slots]
        events: list[Any] = [None] * per_thread
        k = 0
        with torch.cuda.stream(stream):
            while True:
                try:
                    ci, path, foff, coff, n = work.get_nowait()
                except queue.Empty:
                    break
                if events[k] is not None:
                    events[k].synchronize()  # the slot's previous copy has left it
                _pread_into(files.fds[path], views[k][:n], foff, path)
                last_read[i] = time.perf_counter()
                arena.chunks[ci][coff : coff + n].copy_(slots[k][:n], non_blocking=True)
                events[k] = torch.cuda.Event()
                events[k].record(stream)
                tick(n)
                k = (k + 1) % per_thread
        stream.synchronize()

    _run_workers(threads, reader)
    torch.cuda.synchronize(device)
    empty_host_cache(torch)  # give the staging slots back instead of keeping them cached for the whole run
    return max(last_read) or time.perf_counter()


def empty_host_cache(torch: Any) -> None:
    """Return torch's cached pinned blocks to the system (the name moved between torch versions)."""
    fn = getattr(torch._C, "_host_emptyCache", None) or getattr(
        getattr(torch, "accelerator", None), "empty_host_cache", None
    )
    if fn is not None:
        with contextlib.suppress(RuntimeError):  # a build without an accelerator has no cache to empty
            fn()


class _Registrar:
    """cudaHostRegister / cudaHostUnregister through torch's cudart binding (already loaded: cuda-python's runtime
    module costs a fresh process 0.07-0.13 s to import, ten times the page-lock of the staging ring itself;
    benchmarks/register_first_h200.txt)."""

    def __init__(self) -> None:
        import torch

        self._rt = torch.cuda.cudart()

    def register(self, ptr: int, size: int, flags: int = REGISTER_READ_ONLY | REGISTER_PORTABLE) -> None:
        err = self._rt.cudaHostRegister(ptr, size, flags)
        code = int(getattr(err, "value", err))  # a pybind enum, or an int
        if code != 0:
            kind = "read-only" if flags & REGISTER_READ_ONLY else "staging"
            raise UploadError(
                f"cudaHostRegister ({kind}) of {size} bytes failed with CUDA error {code}; use --method ring"
            )

    def unregister(self, ptr: int) -> None:
        self._rt.cudaHostUnregister(ptr)


def _windows(
    arena: DeviceArena, window_bytes: int
) -> list[tuple[Path, int, int, list[tuple[int, int, int, int]]]]:
    """Disjoint page-aligned file windows (path, start, end, copies) covering every chunk.

    Each copy is (chunk index, file offset, chunk offset, length) and lies inside its window, so
    no page is ever registered twice even where chunks of one file share a page.
    """
    out: dict[tuple[Path, int], list[tuple[int, int, int, int]]] = {}
    for ci, chunk in enumerate(arena.plan.chunks):
        pos, end = chunk.offset, chunk.offset + chunk.nbytes
        while pos < end:
            w = pos // window_bytes
            stop = min(end, (w + 1) * window_bytes)
            out.setdefault((chunk.path, w), []).append((ci, pos, pos - chunk.offset, stop - pos))
            pos = stop
    windows = []
    for (path, w), copies in out.items():
        lo = min(c[1] for c in copies)
        hi = max(c[1] + c[3] for c in copies)
        start, stop = lo - lo % PAGE, -(-hi // PAGE) * PAGE
        windows.append((path, max(start, w * window_bytes), min(stop, (w + 1) * window_bytes), copies))
    return windows


def _upload_register(
    arena: DeviceArena, files: _Files, threads: int, window_bytes: int, tick: Progress
) -> float:
    import torch

    device = arena.device
    reg = _Registrar()
    window_bytes = max(PAGE, window_bytes - window_bytes % PAGE)
    windows = _windows(arena, window_bytes)
    bases = {p: files.map(p) for p in {w[0] for w in windows}}
    lock = threading.Lock()
    registered: set[int] = set()

    def register(w: tuple[Path, int, int, list]) -> tuple[int, float]:
        path, start, stop, _ = w
        base, length = bases[path]
        ptr = base + start
        size = min(stop, length) - start
        # Cold cache: ask for the whole window at once rather than faulting it in page by page.
        os.posix_fadvise(files.fds[path], start, size, os.POSIX_FADV_WILLNEED)
        reg.register(ptr, size)
        with lock:
            registered.add(ptr)
        return ptr, time.perf_counter()

    def unregister(ptr: int) -> None:
        with lock:
            registered.discard(ptr)
        reg.unregister(ptr)

    stream = torch.cuda.Stream(device=device)
    ahead = max(1, threads)
    pending: list[tuple[Any, int]] = []  # (event, registered pointer) of copies in flight
    last_read = time.perf_counter()
    # Registration threads must use this device's context, not device 0's.
    pool = ThreadPoolExecutor(max_workers=ahead, initializer=torch.cuda.set_device, initargs=(device,))
    futures = [pool.submit(register, w) for w in windows[:ahead]]
    try:
        with torch.cuda.stream(stream):
            for i, (path, _, _, copies) in enumerate(windows):
                if i + ahead < len(windows):
                    futures.append(pool.submit(register, windows[i + ahead]))
                ptr, last_read = futures[i].result()
                for ci, foff, coff, n in copies:
                    # ctypes calls the read-only map writable; torch only reads it here
                    src = torch.frombuffer(_host_bytes(bases[path][0] + foff, n), dtype=torch.uint8)
                    arena.chunks[ci][coff : coff + n].copy_(src, non_blocking=True)
                    del src
                    tick(n)
                event = torch.cuda.Event()
                event.record(stream)
                pending.append((event, ptr))
                while pending and pending[0][0].query():
                    unregister(pending.pop(0)[1])
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        stream.synchronize()
        for ptr in list(registered):
            unregister(ptr)
        bases.clear()
    return last_read
