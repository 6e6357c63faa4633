"""Stand-ins for the CUDA pieces the upload paths call, so that their control flow runs on the CPU.

Helpers to import (`from support.fakes import FakeDriver`); the fixtures that install them live in
tests/conftest.py. (Importing them from `conftest` breaks as soon as another folder has a conftest.py of its own:
pytest imports each as the module `conftest`.)
"""

from __future__ import annotations

import ctypes
import threading
import time


class FakeCuda:
    """Enough of torch.cuda for the upload paths to run their control flow on the CPU (and for the placement
    check: `memory` is the (free, total) bytes mem_get_info reports)."""

    memory = (80 << 30, 80 << 30)

    @classmethod
    def mem_get_info(cls, device=None):
        return cls.memory

    @staticmethod
    def current_device():
        return 0

    class Stream:
        cuda_stream = 0

        def __init__(self, device=None):
            pass

        def synchronize(self):
            pass

    class Event:
        def __init__(self, **flags):
            pass

        def record(self, stream=None):
            pass

        def synchronize(self):
            pass

        def query(self):
            return True

    @staticmethod
    def stream(s):
        import contextlib

        return contextlib.nullcontext()


COPY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
ONE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
TWO = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)


class FakeDriver:
    """Copies land at once (host memory as the device); events count records and waits; copy number
    `fail_at` returns `code`."""

    def __init__(self, fail_at: int = -1, code: int = 7, delay: float = 0.0) -> None:
        self.lock = threading.Lock()
        self.copies, self.records, self.syncs, self.pending = 0, 0, 0, set()
        self.reused_unsynced = 0
        self.slot_of_event: dict[int, int] = {}

        def copy(dst, src, n, stream):
            with self.lock:
                self.copies += 1
                if self.copies == fail_at:
                    return code
            ctypes.memmove(dst, src, n)
            if delay:
                time.sleep(delay)
            return 0

        def record(event, stream):
            with self.lock:
                if event in self.pending:
                    self.reused_unsynced += 1  # a slot rewritten before its copy was waited for
                self.pending.add(event)
                self.records += 1
            return 0

        def sync(event):
            with self.lock:
                self.pending.discard(event)
                self.syncs += 1
            return 0

        self.fns = (COPY(copy), TWO(record), ONE(sync))

    def calls(self):
        from tfc.runtime.boot.upload_native import Driver

        addr = [ctypes.cast(f, ctypes.c_void_p).value for f in self.fns]
        return Driver(0, *addr)
