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


def resident_fraction(paths, samples: int = 4096) -> float:
    """Fraction of the files' pages in the page cache, from at most `samples` pages spread evenly over them.

    mincore on a fresh read-only map of each file reads no page. A probe of every page walks the page
    cache once per 4 KiB, which took 0.2 s for a 22 GB image on the H200 host (benchmarks/boot_h200.md);
    a few thousand evenly spaced pages decide between a warm and a cold upload just as well, and files
    with fewer pages than that are probed page by page (exactly).
    """
    lib = libc()
    sizes = {p: os.stat(p).st_size for p in paths}
    total_pages = sum(-(-size // mmap.PAGESIZE) for size in sizes.values())
    if not total_pages:
        return 0.0
    stride = max(1, total_pages // max(1, samples))
    have = seen = 0
    vec = ctypes.c_ubyte()
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
            if stride == 1:
                page_bits = (ctypes.c_ubyte * pages)()
                if lib.mincore(addr, size, page_bits) == 0:
                    have += pages - bytes(page_bits).count(0)  # only bit 0 is defined; the others are zero
                    seen += pages
                continue
            for page in range(0, pages, stride):
                if lib.mincore(addr + page * mmap.PAGESIZE, mmap.PAGESIZE, ctypes.byref(vec)) == 0:
                    have += vec.value & 1
                    seen += 1
        finally:
            lib.munmap(addr, size)
    return round(have / seen, 4) if seen else 0.0
