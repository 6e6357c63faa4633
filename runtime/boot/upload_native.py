"""The mmap upload's copy loop in C (runtime/boot/stage_copy.c), for `MmapStaging(copier="native")`.

The Python copy threads of upload_mmap take the interpreter's lock several times a piece, so small pieces
(whose staging could stay in the host's last-level cache while the DMA reads it) cost more in lock waits than
they save (benchmarks/summaries/boot.md). Here one ctypes call runs the whole loop on C threads with the lock
released.
It is built on first use with the system C compiler (`$CC`, else `cc`; Triton's launcher needs one on every GPU
host) into the TFC_NATIVE_CACHE folder (an internal setting, default ~/.cache/tfc/native), named by the source's
digest, and loaded with ctypes. The CUDA driver calls go in as function pointers (libcuda's, or host-only
stand-ins in the tests); `upload_native` is upload_mmap's ring on these threads.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tfc.runtime.boot import upload_files as uf
from tfc.runtime.boot import upload_mmap as um
from tfc.runtime.boot.arena import DeviceArena

from tfc import settings

SOURCE = Path(__file__).with_name("stage_copy.c")
_LOCK = threading.Lock()
_LIB: list[ctypes.CDLL] = []
_P = ctypes.c_void_p


def cache_dir() -> Path:
    """Where the copier is built: the TFC_NATIVE_CACHE setting (default ~/.cache/tfc/native)."""
    return settings.get("TFC_NATIVE_CACHE")


def library() -> ctypes.CDLL:
    """The built copy loop (built once per source digest, then loaded from the cache)."""
    with _LOCK:
        if _LIB:
            return _LIB[0]
        text = SOURCE.read_bytes()
        path = cache_dir() / f"stage_copy-{hashlib.sha256(text).hexdigest()[:16]}.so"
        if not path.exists():
            _build(path)
        try:
            lib = ctypes.CDLL(str(path))
        except OSError as e:
            raise uf.UploadError(f"cannot load the native copier {path}: {e}; use copier python") from e
        lib.tfc_stage.restype = ctypes.c_int
        lib.tfc_stage.argtypes = [_P, ctypes.c_int64, _P, ctypes.c_int, ctypes.c_int, _P, _P, _P, _P, _P, _P, _P,
                                  ctypes.c_int, _P, _P, _P]  # fmt: skip
        _LIB.append(lib)
        return lib


def _build(path: Path) -> None:
    """Compile SOURCE into the shared library `path` (written beside it, then renamed into place)."""
    cc = os.environ.get("CC", "cc")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=path.parent)
    except OSError as e:
        raise uf.UploadError(
            f"cannot write the native copier into {path.parent} ({e.strerror}); set TFC_NATIVE_CACHE"
        ) from e
    os.close(fd)
    try:
        done = subprocess.run([cc, "-O2", "-shared", "-fPIC", "-pthread", "-o", tmp, str(SOURCE)],
                              capture_output=True, text=True, check=False)  # fmt: skip
    except OSError as e:
        os.unlink(tmp)
        raise uf.UploadError(
            f"the native copier needs a C compiler ({cc}: {e.strerror}); use copier python"
        ) from e
    if done.returncode != 0:
        os.unlink(tmp)
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        raise uf.UploadError(f"building the native copier with {cc} failed: {first}; use copier python")
    os.replace(tmp, path)


@dataclass(frozen=True)
class Driver:
    """The driver calls the loop makes, as C function addresses: set a thread's context (0: none needed),
    an asynchronous host-to-device copy, record an event, wait for one."""

    ctx_set: int
    copy: int
    record: int
    sync: int


@dataclass
class NativeTimes:
    """Seconds summed over the loop's threads: waiting for a slot, copying out of the mapping, issuing."""

    wait: float
    copy: float
    issue: float


def stage(
    pieces: np.ndarray,
    slots: list[int],
    threads: int,
    streams: list[int],
    events: list[int],
    driver: Driver,
    ctx: int = 0,
    drop: bool = True,
    tick: Callable[[int], None] | None = None,
) -> NativeTimes:
    """Run the loop over pieces [n, 3] uint64 (source address, device address, bytes): threads x k slots (k =
    len(slots) // threads) with one stream per thread and one event per slot; tick(bytes) as copies are issued."""
    per = len(slots) // max(threads, 1)
    if threads < 1 or per < 1 or per > 64 or len(slots) != threads * per:
        raise uf.UploadError(f"the native copier needs 1-64 slots per thread, got {len(slots)} for {threads}")
    if len(streams) != threads or len(events) != len(slots):
        raise uf.UploadError("the native copier needs a stream per thread and an event per slot")
    rows = np.ascontiguousarray(pieces, dtype=np.uint64).reshape(-1, 3)
    slot_arr = np.asarray(slots, dtype=np.uint64)
    stream_arr, event_arr = (np.asarray(v, dtype=np.uint64) for v in (streams, events))
    done, stop = ctypes.c_int64(0), ctypes.c_int(0)
    stats = np.zeros((threads, 3), dtype=np.float64)
    result: list[int] = []
    lib = library()

    def run() -> None:
        result.append(lib.tfc_stage(rows.ctypes.data, len(rows), slot_arr.ctypes.data, threads, per,
                                    stream_arr.ctypes.data, event_arr.ctypes.data, ctx or None, driver.ctx_set or None,
                                    driver.copy, driver.record, driver.sync, int(drop), ctypes.addressof(done),
                                    stats.ctypes.data, ctypes.addressof(stop)))  # fmt: skip

    worker = threading.Thread(target=run, name="tfc-native-stage", daemon=True)
    worker.start()
    seen = 0
    try:
        while worker.is_alive():  # the loop runs without the interpreter's lock: report progress meanwhile
            worker.join(0.05)
            if tick is not None and done.value > seen:
                tick(done.value - seen)
                seen = done.value
    except BaseException:  # an interrupt (or a failing tick): stop the threads, let their copies finish
        stop.value = 1
        worker.join()
        raise
    if tick is not None and done.value > seen:
        tick(done.value - seen)
    if result != [0]:
        code = result[0] if result else -1
        raise uf.UploadError(f"the native copier stopped: driver result {code}")
    return NativeTimes(*(float(v) for v in stats.sum(axis=0)))


class CudaDriver:
    """The libcuda calls the native copier makes or needs set up (the driver API: each of its threads sets the
    device's primary context, the one torch's runtime uses)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise uf.UploadError("the native copier needs the CUDA driver (libcuda.so.1)") from e

    def _addr(self, name: str) -> int:
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value or 0

    def calls(self) -> Driver:
        return Driver(self._addr("cuCtxSetCurrent"), self._addr("cuMemcpyHtoDAsync_v2"),
                      self._addr("cuEventRecord"), self._addr("cuEventSynchronize"))  # fmt: skip

    def check(self, code: int, what: str) -> None:
        if code != 0:
            raise uf.UploadError(f"{what} failed with CUDA driver error {code}")

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


def upload_native(
    arena: DeviceArena,
    pieces: list,
    bases: dict[Any, tuple[int, int]],
    cfg: um.MmapStaging,
    tick: uf.Progress,
) -> um.MmapTimes:
    """upload_mmap's ring with the copy loop on C threads: every slot made up front, one stream per thread."""
    import torch

    rows = np.array([(bases[path][0] + foff, arena.chunks[ci].data_ptr() + coff, n)
                     for ci, path, foff, coff, n in pieces], dtype=np.uint64).reshape(-1, 3)  # fmt: skip
    threads = min(cfg.threads, max(1, len(pieces)))
    cuda = CudaDriver()
    device = torch.device(arena.device)
    torch.cuda.set_device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    streams = [torch.cuda.Stream(device=device) for _ in range(threads)]
    t0 = time.perf_counter()
    slots: list[um.StagingSlot] = []
    ctx, release = cuda.primary_context(index)
    events: list[int] = []
    try:
        for _ in range(threads * cfg.slots_per_thread):  # one by one: a failure frees those already made
            slots.append(um.StagingSlot(cfg.slot_bytes))
        events = cuda.events(len(slots))
        t1 = time.perf_counter()
        steps = stage(rows, [s.addr for s in slots], threads, [s.cuda_stream for s in streams], events,
                      cuda.calls(), ctx, True, tick)  # fmt: skip
    finally:
        cuda.destroy(events)
        for slot in slots:
            slot.free()
        release()
    return um.MmapTimes(read_done=time.perf_counter(), first_copy=t1, staging=t1 - t0,
                        pool=sum(s.take_s for s in slots), wait=steps.wait, copy=steps.copy, issue=steps.issue)  # fmt: skip


__all__ = ["SOURCE", "CudaDriver", "Driver", "NativeTimes", "cache_dir", "library", "stage", "upload_native"]
