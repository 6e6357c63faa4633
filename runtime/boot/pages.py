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


def resident_fraction(paths, samples: int = 4096, windows: int = 256) -> float:
    """Fraction of the files' pages in the page cache, from about `samples` pages in `windows` evenly spread runs.

    mincore on a fresh read-only map of each file reads no page. A probe of every page walks the page
    cache once per 4 KiB, too slow for a boot on a large image (benchmarks/summaries/boot.md); a few thousand
    pages in a few hundred calls decide between a warm and a cold upload just as well, and images with fewer pages
    than `samples` are probed page by page (exactly).
    """
    lib = libc()
    sizes = {p: os.stat(p).st_size for p in paths}
    total_pages = sum(-(-size // mmap.PAGESIZE) for size in sizes.values())
    if not total_pages:
        return 0.0
    every = total_pages <= samples
    run = max(1, samples // max(1, windows))  # pages per window
    stride = max(run, total_pages // max(1, windows))  # pages from one window's start to the next
    have = seen = 0
    for path, size in sizes.items():
        if not size:
            continue
        pages = -(-size // mmap.PAGESIZE)
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = lib.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        finally:
            os.close(fd)  # the mapping keeps the file
        if addr in (None, MAP_FAILED):
            continue
        try:
            for first in [0] if every else range(0, pages, stride):
                n = pages if every else min(run, pages - first)
                bits = (ctypes.c_ubyte * n)()
                length = min(n * mmap.PAGESIZE, size - first * mmap.PAGESIZE)
                if lib.mincore(addr + first * mmap.PAGESIZE, length, bits) == 0:
                    have += n - bytes(bits).count(0)  # only bit 0 is defined; the others are zero
                    seen += n
        finally:
            lib.munmap(addr, size)
    return round(have / seen, 4) if seen else 0.0
