"""Host side of the boot benchmark: memcpy out of a fresh mmap of an image, and pinned staging allocation.

    python3 benchmarks/boot_host.py --image DIR [--threads 16] [--out FILE.json]

DIR is any folder of *.bin files (a rank folder, or one written by boot_h200.py --make-gb). The copy
needs no GPU; the staging allocation is timed only when torch sees CUDA. boot_h200.py calls the
same functions in its run, so the H200 numbers sit beside the boot times they explain.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import json
import mmap
import os
import queue
import sys
import threading
import time
from pathlib import Path

from _bench_env import ensure_tfc

MIB = 1 << 20


def _timed_threads(target, args_list: list[tuple]) -> float:
    """Seconds from starting one thread per argument tuple to the last one finishing."""
    pool = [threading.Thread(target=target, args=args) for args in args_list]
    t0 = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return time.perf_counter() - t0


def _mapped(files: list[Path]) -> list[tuple[int, int]]:
    """Fresh read-only shared maps (address, size) of the files: no page table entries yet."""
    from tfc.runtime.boot.pages import libc

    out = []
    for f in files:
        size = f.stat().st_size
        fd = os.open(f, os.O_RDONLY)
        try:
            out.append((libc().mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0), size))
        finally:
            os.close(fd)
    return out


def mmap_copy(files: list[Path], threads: int, piece: int = 8 * MIB, copier: str = "memmove",
              prefault: bool = False, drop: bool = False) -> dict:  # fmt: skip
    """Copy every byte of the files out of fresh maps with `threads` threads, each into its own
    pre-touched `piece`-sized buffer (as the mmap upload copies into its slots); munmap timed apart."""
    from tfc.runtime.boot.pages import MADV_DONTNEED, MADV_POPULATE_READ, libc

    if copier == "numpy":
        import numpy as np

    lib = libc()
    maps = _mapped(files)
    work: queue.SimpleQueue = queue.SimpleQueue()
    for addr, size in maps:
        for off in range(0, size, piece):
            work.put((addr + off, min(piece, size - off)))
    total = sum(size for _, size in maps)
    bufs = [ctypes.create_string_buffer(piece) for _ in range(threads)]  # zeroed, so touched

    def run(i: int) -> None:
        dst = ctypes.addressof(bufs[i])
        view = np.frombuffer(bufs[i], dtype=np.uint8) if copier == "numpy" else None
        while True:
            try:
                src, n = work.get_nowait()
            except queue.Empty:
                return
            if prefault:
                lib.madvise(src, n, MADV_POPULATE_READ)
            if view is None:
                ctypes.memmove(dst, src, n)
            else:
                np.copyto(view[:n], np.frombuffer((ctypes.c_char * n).from_address(src), dtype=np.uint8))
            if drop:
                lib.madvise(src, n, MADV_DONTNEED)

    seconds = _timed_threads(run, [(i,) for i in range(threads)])
    t1 = time.perf_counter()
    for addr, size in maps:
        lib.munmap(addr, size)
    t2 = time.perf_counter()
    return {"threads": threads, "piece_mib": piece // MIB, "copier": copier, "prefault": prefault,
            "drop": drop, "bytes": total, "seconds": round(seconds, 4),
            "gbps": round(total / seconds / 1e9, 2), "munmap_s": round(t2 - t1, 4)}  # fmt: skip


def host_copies(files: list[Path], threads: int, reps: int = 2) -> list[dict]:
    """The copy variants the mmap upload chooses between, each over the whole image (best of `reps`)."""
    variants = [
        dict(copier="memmove"),
        dict(copier="numpy"),
        dict(copier="memmove", prefault=True),
        dict(copier="memmove", prefault=True, drop=True),
        dict(copier="memmove", drop=True),
    ]
    out = []
    for v in variants:
        if v["copier"] == "numpy" and importlib.util.find_spec("numpy") is None:
            continue
        r = max((mmap_copy(files, threads, **v) for _ in range(reps)), key=lambda r: r["gbps"])
        print(f"host copy {v}: {r['gbps']} GB/s, munmap {r['munmap_s']} s", file=sys.stderr)
        out.append(r)
    return out


def staging_alloc(torch, slots: int, slot_bytes: int, threads: int) -> list[dict]:
    """Seconds to pin `slots` staging slots the way the mmap upload does, serially and from `threads` threads."""
    from boot_variants import slot
    from tfc.runtime.boot.upload_files import empty_host_cache

    out = []
    for pinning in ("register", "torch"):
        for n_threads in (1, threads):
            empty_host_cache(torch)
            held: list = []
            lock = threading.Lock()
            per = -(-slots // n_threads)

            def alloc(k: int, pinning: str = pinning, held: list = held, lock=lock) -> None:
                mine = [slot(slot_bytes, pinning) for _ in range(k)]
                with lock:
                    held.extend(mine)

            seconds = _timed_threads(alloc, [(per,)] * n_threads)
            t1 = time.perf_counter()
            for s in held:
                s.free()
            empty_host_cache(torch)
            nbytes = len(held) * slot_bytes
            out.append({"pinning": pinning, "threads": n_threads, "bytes": nbytes, "seconds": round(seconds, 4),
                        "ms_per_gib": round(seconds * 1e3 / (nbytes / 2**30), 1),
                        "free_s": round(time.perf_counter() - t1, 4)})  # fmt: skip
            print(f"staging alloc {out[-1]}", file=sys.stderr)
    return out


def probe_times(files: list[Path], reps: int = 3) -> list[dict]:
    """Seconds of the page-cache probe over every page and over the runtime's default sample (best of reps)."""
    from tfc.runtime.boot.pages import resident_fraction

    out = []
    for samples in (None, 4096):
        kw = {"samples": samples or 1 << 62}  # more samples than pages: every page
        best, frac = float("inf"), 0.0
        for _ in range(reps):
            t0 = time.perf_counter()
            frac = resident_fraction(files, **kw)
            best = min(best, time.perf_counter() - t0)
        out.append(
            {"pages": "every" if samples is None else samples, "seconds": round(best, 4), "resident": frac}
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", type=Path, required=True, help="a folder of *.bin files")
    ap.add_argument("--threads", type=int, default=16)
    ap.add_argument("--out", type=Path, help="also write the results here as JSON")
    ap.add_argument("--probe-only", action="store_true", help="time the page-cache probe only")
    args = ap.parse_args()
    ensure_tfc()
    files = sorted(args.image.glob("*.bin"))
    if not files:
        sys.exit(f"boot_host: no *.bin files in {args.image}")
    from tfc.runtime.boot.pages import resident_fraction

    res: dict = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "cpus": os.cpu_count(),
                 "bytes": sum(f.stat().st_size for f in files), "resident": resident_fraction(files)}  # fmt: skip
    res["probe"] = probe_times(files)
    if args.probe_only:
        print(json.dumps(res, indent=1))
        return
    res["host_copy"] = host_copies(files, args.threads)
    try:
        import torch

        if torch.cuda.is_available():
            res["staging_alloc"] = staging_alloc(torch, 2 * args.threads, 8 * MIB, args.threads)
    except ImportError:
        pass
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
