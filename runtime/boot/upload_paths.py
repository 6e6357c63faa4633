"""The ring, register and host upload paths (the mmap path has runtime/boot/upload_mmap.py).

* `ring`: reader threads `preadv` file ranges into pinned staging slots and issue async host-to-device copies
  on per-thread CUDA streams; a slot is reused once its copy's event has completed, so reading and copying
  overlap.
* `register`: the files are mmapped read-only and page-locked window by window with `cudaHostRegister`
  (several threads ahead of the copier), each window copied asynchronously and unregistered once its copy
  finished.
* `host`: the arena lives in host memory (no CUDA): threads `preadv` straight into it.

Each returns when the last byte was in host memory (read or registered).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tfc.runtime.boot import upload_files as uf
from tfc.runtime.boot.arena import DeviceArena

PAGE = uf.PAGE


def upload_host(
    arena: DeviceArena, files: uf.RankFiles, threads: int, piece_bytes: int, tick: uf.Progress
) -> float:
    """Read every piece straight into a host arena."""
    work = uf.queue_of(uf.pieces(arena, max(piece_bytes, 1 << 20)))
    views = [memoryview(uf.host_bytes(c.data_ptr(), c.numel())).cast("B") for c in arena.chunks]

    def reader(_: int) -> None:
        while True:
            try:
                ci, path, foff, coff, n = work.get_nowait()
            except queue.Empty:
                return
            uf.pread_into(files.fds[path], views[ci][coff : coff + n], foff, path)
            tick(n)

    uf.run_workers(min(threads, max(1, work.qsize())), reader)
    return time.perf_counter()


def upload_ring(
    arena: DeviceArena, files: uf.RankFiles, threads: int, slot_bytes: int, per_thread: int, tick: uf.Progress
) -> float:
    """Read pieces into each thread's `per_thread` pinned slots and copy them on the thread's stream."""
    import torch

    device = arena.device
    work = uf.queue_of(uf.pieces(arena, slot_bytes))
    threads = min(threads, max(1, work.qsize()))
    last_read = [0.0] * threads

    def reader(i: int) -> None:
        torch.cuda.set_device(device)
        stream = torch.cuda.Stream(device=device)
        slots = [torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(per_thread)]
        views = [memoryview(uf.host_bytes(s.data_ptr(), s.numel())).cast("B") for s in slots]
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
                uf.pread_into(files.fds[path], views[k][:n], foff, path)
                last_read[i] = time.perf_counter()
                arena.chunks[ci][coff : coff + n].copy_(slots[k][:n], non_blocking=True)
                events[k] = torch.cuda.Event()
                events[k].record(stream)
                tick(n)
                k = (k + 1) % per_thread
        stream.synchronize()

    uf.run_workers(threads, reader)
    torch.cuda.synchronize(device)
    uf.empty_host_cache(torch)  # give the staging slots back instead of keeping them cached for the whole run
    return max(last_read) or time.perf_counter()


def windows(
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
    found = []
    for (path, w), copies in out.items():
        lo = min(c[1] for c in copies)
        hi = max(c[1] + c[3] for c in copies)
        start, stop = lo - lo % PAGE, -(-hi // PAGE) * PAGE
        found.append((path, max(start, w * window_bytes), min(stop, (w + 1) * window_bytes), copies))
    return found


def upload_register(
    arena: DeviceArena, files: uf.RankFiles, threads: int, window_bytes: int, tick: uf.Progress
) -> float:
    """Page-lock the mapped files window by window, `threads` windows ahead of the copies out of them."""
    import torch

    device = arena.device
    reg = uf.Registrar()
    window_bytes = max(PAGE, window_bytes - window_bytes % PAGE)
    spans = windows(arena, window_bytes)
    bases = {p: files.map(p) for p in {w[0] for w in spans}}
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
    futures = [pool.submit(register, w) for w in spans[:ahead]]
    try:
        with torch.cuda.stream(stream):
            for i, (path, _, _, copies) in enumerate(spans):
                if i + ahead < len(spans):
                    futures.append(pool.submit(register, spans[i + ahead]))
                ptr, last_read = futures[i].result()
                for ci, foff, coff, n in copies:
                    # ctypes calls the read-only map writable; torch only reads it here
                    src = torch.frombuffer(uf.host_bytes(bases[path][0] + foff, n), dtype=torch.uint8)
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


__all__ = ["upload_host", "upload_register", "upload_ring", "windows"]
