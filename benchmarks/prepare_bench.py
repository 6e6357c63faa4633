"""Prepare throughput against a plain parallel copy of the same bytes on the same disk; verify against reads.

    python benchmarks/prepare_bench.py --work /tmp/bench --make-layers 4 --out benchmarks/results/prepare

Makes (or takes, with --pack) a Flash-geometry pack of random payloads, then in one run, each step after
dropping the files from the page cache (posix_fadvise DONTNEED; /proc/sys/vm/drop_caches where allowed):
1. a plain parallel copy of every pack file (N threads, 64 MiB pread/pwrite, fsync), the disk's ceiling;
2. `prepare` of the pack at TP=1 into a fresh store (covering reads, writes, digests, fsync, publish);
3. a plain parallel read of the image's files, and `verify --full` of the image, cold and warm.
Writes prepare_bench.json and prepare_bench.md into --out and prints the table last.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import ensure_tfc

ensure_tfc()

from tfc.cache.format import RankManifest  # noqa: E402
from tfc.cache.verify import verify_image  # noqa: E402
from tfc.compiler.prepare import prepare  # noqa: E402
from tfc.fixtures.flash_random import write_flash_random  # noqa: E402
from tfc.packs.pack import open_pack  # noqa: E402

BLOCK = 64 << 20


def drop_cache(paths: list[Path]) -> str:
    """Evict files from the page cache; says which method worked."""
    os.sync()
    how = "fadvise"
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("1\n")
        how += "+drop_caches"
    except OSError:
        pass
    return how


def files_of(folder: Path) -> list[Path]:
    return sorted(
        p for p in folder.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".bin", ".json")
    )


def _buffers(jobs: int) -> threading.local:
    """One preallocated, pre-touched 64 MiB buffer a thread: the baselines pay no allocation per read."""
    local = threading.local()
    local.size = BLOCK
    return local


def _buffer(local: threading.local) -> memoryview:
    if not hasattr(local, "buf"):
        local.buf = bytearray(BLOCK)  # zero-filled once: pages touched before timing matters
    return memoryview(local.buf)


def parallel_copy(src: list[Path], dst_dir: Path, jobs: int) -> float:
    """Copy files with `jobs` threads in 64 MiB preadv/pwrite through per-thread buffers, fsync each; seconds."""
    dst_dir.mkdir(parents=True, exist_ok=True)
    work = []
    outs = {}
    for path in src:
        size = path.stat().st_size
        out = dst_dir / path.name
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.ftruncate(fd, size)
        outs[path] = fd
        work += [(path, off, min(BLOCK, size - off)) for off in range(0, size, BLOCK)]
    ins = {p: os.open(p, os.O_RDONLY) for p in src}
    local = _buffers(jobs)

    def one(job):
        path, off, n = job
        view = _buffer(local)[:n]
        got = os.preadv(ins[path], [view], off)
        os.pwrite(outs[path], view[:got], off)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda _: _buffer(local), range(jobs * 4)))  # allocate buffers outside the timing
        t0 = time.perf_counter()
        list(pool.map(one, work))
        for fd in outs.values():
            os.fsync(fd)
        seconds = time.perf_counter() - t0
    for fd in [*outs.values(), *ins.values()]:
        os.close(fd)
    return seconds


def parallel_read(paths: list[Path], jobs: int) -> tuple[float, int]:
    """Read files with `jobs` threads in 64 MiB preadv into per-thread buffers; (seconds, bytes)."""
    fds = {p: os.open(p, os.O_RDONLY) for p in paths}
    work = [(p, off) for p in paths for off in range(0, p.stat().st_size, BLOCK)]
    local = _buffers(jobs)

    def one(job):
        path, off = job
        return os.preadv(fds[path], [_buffer(local)], off)

    with ThreadPoolExecutor(jobs) as pool:
        list(pool.map(lambda _: _buffer(local), range(jobs * 4)))
        t0 = time.perf_counter()
        total = sum(pool.map(one, work))
        seconds = time.perf_counter() - t0
    for fd in fds.values():
        os.close(fd)
    return seconds, total


def cpu_name() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        return next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")
        )
    except Exception:
        return platform.processor() or "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="scratch folder on the disk under test")
    ap.add_argument("--pack", type=Path, help="an existing pack (else one is made)")
    ap.add_argument("--make-layers", type=int, default=4, help="backbone layers of the made pack (4 = 22 GB)")
    ap.add_argument("--jobs", type=int, default=min(16, 2 * (os.cpu_count() or 2)))
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--keep-image", action="store_true", help="leave the prepared image in --work/store")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    results: dict = {"host": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version()},
                     "jobs": args.jobs, "command": " ".join(sys.argv)}  # fmt: skip
    pack_dir = args.pack
    if pack_dir is None:
        pack_dir = work / "pack"
        shutil.rmtree(pack_dir, ignore_errors=True)
        t0 = time.perf_counter()
        write_flash_random(pack_dir, layers=args.make_layers, jobs=args.jobs)  # = tfc fixture flash-random
        results["make_pack_s"] = time.perf_counter() - t0
    pack_files = files_of(pack_dir)
    pack_bytes = sum(p.stat().st_size for p in pack_files)
    results["pack_bytes"] = pack_bytes
    copies, prepares = [], []
    image_path = None
    for _ in range(args.repeats):
        results["cache_drop"] = drop_cache(pack_files)
        seconds = parallel_copy(pack_files, work / "copy", args.jobs)
        copies.append(pack_bytes / seconds / 1e9)
        shutil.rmtree(work / "copy")
        drop_cache(pack_files)
        store = work / "store"
        shutil.rmtree(store, ignore_errors=True)
        t0 = time.perf_counter()
        pack = open_pack(pack_dir)
        result = prepare(pack, store, 1, jobs=args.jobs)
        seconds = time.perf_counter() - t0
        prepares.append(result.bytes_written / seconds / 1e9)
        image_path = result.path
    results["copy_gbps"] = statistics.median(copies)
    results["prepare_gbps"] = statistics.median(prepares)
    results["prepare_over_copy"] = results["prepare_gbps"] / results["copy_gbps"]
    image_files = [p for p in files_of(image_path) if p.suffix == ".bin"]
    image_bytes = sum(p.stat().st_size for p in image_files)
    results["image_bytes"] = image_bytes
    for temp in ("cold", "warm"):
        if temp == "cold":
            drop_cache(image_files)
        else:
            parallel_read(image_files, args.jobs)  # pull every file into the page cache first
        seconds, got = parallel_read(image_files, args.jobs)
        assert got == image_bytes, f"read {got} of {image_bytes} bytes"
        results[f"read_{temp}_gbps"] = image_bytes / seconds / 1e9
        if temp == "cold":
            drop_cache(image_files)
        else:
            parallel_read(image_files, args.jobs)
        t0 = time.perf_counter()
        report = verify_image(image_path, mode="full", jobs=args.jobs)
        seconds = time.perf_counter() - t0
        segment_bytes = sum(s.length for s in RankManifest.load(image_path / "rank0").segments)
        assert report.ok and report.bytes_checked == segment_bytes, report.problems[:3]
        results[f"verify_{temp}_gbps"] = image_bytes / seconds / 1e9
        results[f"verify_over_read_{temp}"] = results[f"verify_{temp}_gbps"] / results[f"read_{temp}_gbps"]
    if not args.keep_image:
        shutil.rmtree(work / "store", ignore_errors=True)
    (args.out / "prepare_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = [
        ("pack bytes", f"{pack_bytes / 1e9:.2f} GB"),
        ("plain parallel copy (cold, fsync)", f"{results['copy_gbps']:.2f} GB/s"),
        ("tfc prepare TP=1 (cold, fsync, digests)", f"{results['prepare_gbps']:.2f} GB/s"),
        ("prepare / copy (target >= 0.8)", f"{results['prepare_over_copy']:.2f}"),
        ("plain parallel read of image, cold / warm", f"{results['read_cold_gbps']:.2f} / {results['read_warm_gbps']:.2f} GB/s"),
        ("verify --full, cold / warm", f"{results['verify_cold_gbps']:.2f} / {results['verify_warm_gbps']:.2f} GB/s"),
        ("verify / read, cold / warm (target >= 0.8)", f"{results['verify_over_read_cold']:.2f} / {results['verify_over_read_warm']:.2f}"),
    ]  # fmt: skip
    md = [f"# prepare and verify throughput\n\nHost: {results['host']['cpu']}, {results['host']['cores']} cores; "
          f"{args.jobs} threads; page cache dropped with {results.get('cache_drop')}.\n\nCommand: `{results['command']}`\n",
          "| measure | value |", "| --- | --- |"] + [f"| {a} | {b} |" for a, b in rows]  # fmt: skip
    (args.out / "prepare_bench.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
