"""Mappings and the page cache through libc: a typed libc, the mincore residency probe, madvise advice."""

from __future__ import annotations

import ctypes
import functools
import mmap
import os

MAP_FAILED = ctypes.c_void_p(-1).value
MADV_WILLNEED = 3
MADV_DONTNEED = 4
MADV_HUGEPAGE = 14
MADV_POPULATE_READ = 22  # Linux >= 5.14; older kernels answer EINVAL
MADV_POPULATE_WRITE = 23


@functools.cache
def libc() -> ctypes.CDLL:
    """libc with mmap, munmap, mincore and madvise typed for 64-bit pointers and sizes."""
    lib = ctypes.CDLL(None, use_errno=True)
    lib.mmap.restype = ctypes.c_void_p
    lib.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    lib.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return lib


def resident_fraction(paths) -> float:
    """Fraction of the files' pages in the page cache (mincore on a fresh read-only map; no page is read)."""
    lib = libc()
    have = total = 0
    for path in paths:
        size = os.stat(path).st_size
        if not size:
            continue
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)  # the mapping keeps the file
        if addr in (None, MAP_FAILED):
            continue
        try:
            rc = lib.mincore(addr, size, vec)
        finally:
            lib.munmap(addr, size)
        if rc == 0:
            have += pages - bytes(vec).count(0)  # only bit 0 is defined; the others are zero
            total += pages
    return round(have / total, 4) if total else 0.0
