"""Start the CUDA driver and the device's primary context on a thread while the boot imports torch.

A fresh process's first CUDA call pays the driver's start and the primary context; a thread can make that
context while torch imports, so the boot no longer waits for it (benchmarks/summaries/boot.md). torch's runtime
attaches to that same primary context, so nothing else changes. Without a driver or a device the thread does nothing: torch's own start then reports the problem.
"""

from __future__ import annotations

import ctypes
import os
import threading


def uses_cuda(device: str | None) -> bool:
    """Whether a boot on `device` runs on CUDA: asked for by name, or by default where an NVIDIA driver is."""
    if device in (None, "auto"):
        return os.path.exists("/dev/nvidiactl")
    return device.startswith("cuda")


def device_index(device: str | None) -> int:
    """The driver's ordinal for `device` (cuda:N is N; cuda, auto or none is 0, torch's default device)."""
    if device and device.startswith("cuda:"):
        try:
            return int(device.split(":", 1)[1])
        except ValueError:
            return 0  # not a device torch will accept either: it reports that itself
    return 0


class EarlyContext:
    """Retains device `index`'s primary context on a daemon thread started at construction; `release` drops
    that hold once the boot is done (torch's runtime keeps its own)."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.retained = False
        self._lib: ctypes.CDLL | None = None
        self._dev = ctypes.c_int()
        self._thread = threading.Thread(target=self._start, name="tfc-cuda-start", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError:
            return
        ctx = ctypes.c_void_p()
        if lib.cuInit(0) or lib.cuDeviceGet(ctypes.byref(self._dev), self.index):
            return
        if lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), self._dev) == 0:
            self._lib, self.retained = lib, True

    def release(self) -> None:
        """Wait for the thread, then drop its hold on the context (if it got one)."""
        self._thread.join()
        if self.retained and self._lib is not None:
            self._lib.cuDevicePrimaryCtxRelease_v2(self._dev)
            self.retained = False


def start(device: str | None) -> EarlyContext | None:
    """Begin making `device`'s CUDA context on a thread, or None where this boot will not use CUDA."""
    return EarlyContext(device_index(device)) if uses_cuda(device) else None


__all__ = ["EarlyContext", "device_index", "start", "uses_cuda"]
