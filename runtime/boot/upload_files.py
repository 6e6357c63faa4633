"""What every upload path shares: the rank's open files and maps, slot-sized pieces, reads, worker threads,
page-locking."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tfc.runtime.boot.arena import DeviceArena
from tfc.runtime.boot.pages import MAP_FAILED, libc

from tfc.errors import TfcError

PAGE = mmap.PAGESIZE
REGISTER_READ_ONLY = 0x08  # cudaHostRegisterReadOnly
REGISTER_PORTABLE = 0x01  # cudaHostRegisterPortable

Progress = Callable[[int], None]


class UploadError(TfcError):
    """The bytes could not be moved into the arena (short file, refused registration, ...)."""


class RankFiles:
    """Open file descriptors (and, for the mmap and register paths, read-only maps) of the arena's files."""

    def __init__(self, arena: DeviceArena) -> None:
        self.paths = sorted({c.path for c in arena.plan.chunks})
        self.fds: dict[Path, int] = {}
        self.maps: dict[Path, tuple[int, int]] = {}

    def __enter__(self) -> RankFiles:
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


def host_bytes(addr: int, n: int) -> Any:
    """A writable ctypes byte array over host memory (a buffer for preadv and torch.frombuffer)."""
    return (ctypes.c_char * n).from_address(addr)


def pieces(arena: DeviceArena, piece_bytes: int) -> list[tuple[int, Path, int, int, int]]:
    """(chunk index, file, file offset, chunk offset, length) of every slot-sized piece."""
    out = []
    for ci, chunk in enumerate(arena.plan.chunks):
        for off in range(0, chunk.nbytes, piece_bytes):
            n = min(piece_bytes, chunk.nbytes - off)
            out.append((ci, chunk.path, chunk.offset + off, off, n))
    return out


def pread_into(fd: int, buf: memoryview, offset: int, path: Path) -> None:
    """Fill `buf` from `offset`, looping over short reads; a file that ends early is an error."""
    done = 0
    while done < len(buf):
        n = os.preadv(fd, [buf[done:]], offset + done)
        if n <= 0:
            raise UploadError(f"{path} ends at {offset + done}, before the {len(buf)} bytes at {offset}")
        done += n


def run_workers(n: int, work: Callable[[int], None], on_error: Callable[[], None] | None = None) -> None:
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


def queue_of(items: list) -> queue.SimpleQueue:
    """A queue holding `items`, for worker threads to take from."""
    q: queue.SimpleQueue = queue.SimpleQueue()
    for it in items:
        q.put(it)
    return q


def empty_host_cache(torch: Any) -> None:
    """Return torch's cached pinned blocks to the system (the name moved between torch versions)."""
    fn = getattr(torch._C, "_host_emptyCache", None) or getattr(
        getattr(torch, "accelerator", None), "empty_host_cache", None
    )
    if fn is not None:
        with contextlib.suppress(RuntimeError):  # a build without an accelerator has no cache to empty
            fn()


class Registrar:
    """cudaHostRegister / cudaHostUnregister through torch's cudart binding (already loaded, where cuda-python's
    runtime module would cost a fresh process more to import than the page-lock itself)."""

    def __init__(self) -> None:
        import torch

        self._rt = torch.cuda.cudart()

    def register(self, ptr: int, size: int, flags: int = REGISTER_READ_ONLY | REGISTER_PORTABLE,
                 what: str = "", hint: str = "use --method ring") -> None:  # fmt: skip
        err = self._rt.cudaHostRegister(ptr, size, flags)
        code = int(getattr(err, "value", err))  # a pybind enum, or an int
        if code != 0:
            kind = what or ("read-only" if flags & REGISTER_READ_ONLY else "staging")
            raise UploadError(
                f"cudaHostRegister ({kind}) of {size} bytes failed with CUDA error {code}; {hint}"
            )

    def unregister(self, ptr: int) -> None:
        self._rt.cudaHostUnregister(ptr)


__all__ = [
    "PAGE",
    "REGISTER_PORTABLE",
    "REGISTER_READ_ONLY",
    "Progress",
    "RankFiles",
    "Registrar",
    "UploadError",
    "empty_host_cache",
    "host_bytes",
    "pieces",
    "pread_into",
    "queue_of",
    "run_workers",
]
