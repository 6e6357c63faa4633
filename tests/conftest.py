"""Shared pytest fixtures: synthetic packs built once per session."""

from __future__ import annotations

import ctypes
import importlib.util
import threading
import time

import pytest


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture()
def one_torch_thread():
    """Tiny shapes: one intra-op thread avoids spin-waits on a loaded 2-core box."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_pack(tmp_path_factory):
    """The tiny synthetic DeepSeek-V4.1 pack, written once per session (treat as read-only)."""
    from tfc.fixtures.tiny import write_tiny

    out = tmp_path_factory.mktemp("tiny") / "pack"
    write_tiny(out)
    return out


@pytest.fixture(scope="session")
def flash_headers_pack(tmp_path_factory):
    """The full-geometry DeepSeek-V4.1-Flash pack with payloads as holes (treat as read-only)."""
    from tfc.fixtures.flash_headers import write_flash_headers

    out = tmp_path_factory.mktemp("flash") / "pack"
    write_flash_headers(out)
    return out


class FakeCuda:
    """Enough of torch.cuda for the upload paths to run their control flow on the CPU."""

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


@pytest.fixture()
def fake_cuda(monkeypatch):
    """torch.cuda streams/events as no-ops, pinned memory as plain memory, host registrations recorded.

    `live` maps each registered address to its (size, flags) until it is unregistered; `seen` lists the
    (size, flags) of every registration.
    """
    import types

    import torch
    from tfc.runtime.boot import upload_files as up

    for name in ("Stream", "Event", "stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(FakeCuda, name))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    live: dict[int, tuple[int, int]] = {}
    seen: list[tuple[int, int]] = []

    class Registrar:
        def register(self, ptr, size, flags=up.REGISTER_READ_ONLY | up.REGISTER_PORTABLE):
            assert ptr % up.PAGE == 0 and ptr not in live
            live[ptr] = (size, flags)
            seen.append((size, flags))

        def unregister(self, ptr):
            del live[ptr]

    monkeypatch.setattr(up, "Registrar", Registrar)
    return types.SimpleNamespace(live=live, seen=seen)


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
