#!/usr/bin/env python3
"""`tfc prepare` against a plain parallel copy of the same pack, and `tfc verify --full` against a plain parallel
read of the image, cold and warm, on the same disk in the same run.

    python benchmarks/prepare_verify.py --work DIR [--layers 4] [--json]      # 22 GB pack: a few minutes
    python benchmarks/prepare_verify.py --work DIR --fixture tiny             # 28 MB: a check of the script

Makes `tfc fixture flash-random --layers N` (or the tiny pack) under --work, on the disk under test. Each step
starts with the files dropped from the page cache (posix_fadvise; /proc/sys/vm/drop_caches where allowed):
1. a plain parallel copy of every pack file (--jobs threads, 64 MiB pread / pwrite, fsync): the disk's ceiling;
2. `prepare` of the pack at TP=1 into a fresh store (reads, writes, digests, fsync, publish);
3. a plain parallel read of the image's files, then `verify --full` of the image, cold, then both warm.
Also timed: BLAKE3 in memory as tfc hashes a segment (4 MiB chunks on every core), the bound of a warm verify on a
host with few cores.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c

BLOCK = 64 << 20


def pack_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def parallel_copy(src: list[Path], dst: Path, jobs: int) -> float:
    """Copy files with `jobs` threads in 64 MiB pread / pwrite through per-thread buffers, fsync each; GB/s."""
    import threading

    dst.mkdir(parents=True, exist_ok=True)
    ins = {p: os.open(p, os.O_RDONLY) for p in src}
    outs = {p: os.open(dst / p.name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644) for p in src}
    work = [
        (p, off, min(BLOCK, p.stat().st_size - off)) for p in src for off in range(0, p.stat().st_size, BLOCK)
    ]
    local = threading.local()

    def one(job) -> None:
        path, off, n = job
        if not hasattr(local, "buf"):
            local.buf = bytearray(BLOCK)
        view = memoryview(local.buf)[:n]
        got = os.preadv(ins[path], [view], off)
        os.pwrite(outs[path], view[:got], off)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(one, work))
    for fd in outs.values():
        os.fsync(fd)
    seconds = time.perf_counter() - t0
    for fd in [*ins.values(), *outs.values()]:
        os.close(fd)
    return sum(n for _, _, n in work) / seconds / 1e9


def blake3_gbps(nbytes: int = 512 << 20) -> float:
    """tfc's segment digest over bytes in memory (its chunks hashed on every core), GB/s."""
    from tfc.cache.digest import digest_bytes

    buf = memoryview(os.urandom(1 << 20) * (nbytes >> 20))
    return nbytes / c.host_timed(lambda: digest_bytes(buf), reps=3, warm=1) / 1e9


def main() -> None:
    ap = c.parser(__doc__, device=False)
    ap.add_argument("--work", type=Path, required=True, help="a folder on the disk under test")
    ap.add_argument("--fixture", choices=("flash-random", "tiny"), default="flash-random")
    ap.add_argument(
        "--layers", type=int, default=4, help="backbone layers of flash-random (at least 4; 4: 22 GB)"
    )
    ap.add_argument(
        "--jobs", type=int, default=min(16, 2 * (os.cpu_count() or 2)), help="threads of every step"
    )
    args = ap.parse_args()
    c.ensure_tfc()
    from tfc.cache.verify import verify_image
    from tfc.compiler.prepare import prepare
    from tfc.packs.pack import open_pack

    run = c.Run("prepare", "prepare_verify.py", "cpu", args.commit)
    work = args.work
    pack, store = work / "pack", work / "store"
    shutil.rmtree(pack, ignore_errors=True)
    extra = ["--layers", str(args.layers), "-j", str(args.jobs)] if args.fixture == "flash-random" else []
    c.tfc("fixture", args.fixture, str(pack), *extra)
    files = pack_files(pack)
    run.data.update(fixture=args.fixture, pack_bytes=sum(p.stat().st_size for p in files), jobs=args.jobs)
    run.data["drop"] = c.drop_page_cache(files)
    copy = parallel_copy(files, work / "copy", args.jobs)
    shutil.rmtree(work / "copy")
    c.drop_page_cache(files)
    shutil.rmtree(store, ignore_errors=True)
    t0 = time.perf_counter()
    result = prepare(open_pack(pack), store, 1, jobs=args.jobs)
    prep = result.bytes_written / (time.perf_counter() - t0) / 1e9
    shutil.rmtree(pack)
    image = Path(result.path)
    data = sorted(p for p in image.rglob("*.bin"))
    nbytes = sum(p.stat().st_size for p in data)
    run.data.update(copy_gbps=copy, prepare_gbps=prep, image_bytes=nbytes)
    print(f"[prepare] {prep:.2f} GB/s against a plain copy's {copy:.2f} GB/s", flush=True)
    run.metric("prepare.vs_copy", prep / copy, "x", ">= 0.8",
               f"a plain parallel copy of the same pack, fsync, same run ({copy:.2f} GB/s)")  # fmt: skip
    hashing = blake3_gbps()
    run.data["blake3_gbps"] = hashing
    for temp in ("cold", "warm"):
        if temp == "cold":
            c.drop_page_cache(data)
        else:
            c.read_gbps(data, args.jobs)
        read = c.read_gbps(data, args.jobs)
        if temp == "cold":
            c.drop_page_cache(data)
        t0 = time.perf_counter()
        report = verify_image(image, mode="full", jobs=args.jobs)
        verify = nbytes / (time.perf_counter() - t0) / 1e9
        if not report.ok:
            raise RuntimeError(f"verify --full found damage in a fresh image: {report.problems[:3]}")
        run.data[temp] = {"read_gbps": read, "verify_gbps": verify}
        print(f"[verify] {temp}: {verify:.2f} GB/s against a plain read's {read:.2f} GB/s", flush=True)
        bound = f"; BLAKE3 in memory {hashing:.1f} GB/s on {os.cpu_count()} cores" if temp == "warm" else ""
        run.metric(f"verify.full_vs_read.{temp}", verify / read, "x", ">= 0.8",
                   f"a plain parallel read of the {'cached ' if temp == 'warm' else ''}image, same run "
                   f"({read:.2f} GB/s){bound}")  # fmt: skip
    shutil.rmtree(store, ignore_errors=True)
    run.finish(args.json)


if __name__ == "__main__":
    main()
