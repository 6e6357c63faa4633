"""Benchmark `verify --full` against plain parallel reading of the same bytes, and digest speeds.

Builds a random image of --size-gb through ImageWriter, then measures (median of --repeats):
plain parallel pread of every data file, verify_image full and sample, each with a warm page
cache and cold (posix_fadvise DONTNEED on every file first); and in-memory digest speeds of
BLAKE3 (1 thread, max_threads=AUTO, tfc's 4 MiB chunks over all cores), SHA-256 (1 thread, 64 MiB
chunks over all cores) and xxhash when installed. Writes a markdown report to --out.

    python benchmarks/verify_local.py --size-gb 4 --out benchmarks/results/verify/verify_local.md
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from tfc.cache import digest as dg
from tfc.cache.format import RankManifest
from tfc.cache.key import image_key
from tfc.cache.verify import verify_image
from tfc.cache.writer import ImageWriter

GB = 1e9


def build_image(root: Path, size: int, seed: int = 0) -> tuple[Path, float]:
    """A rank image of ~size random bytes: big expert-like segments plus many small ones, 8 files."""
    rng = np.random.default_rng(seed)
    sizes: list[int] = []
    small_budget = size // 20
    while sum(sizes) < small_budget:
        sizes.append(int(rng.integers(1 << 10, 1 << 20)))
    while sum(sizes) < size:
        sizes.append(min(int(rng.integers(32 << 20, 256 << 20)), size - sum(sizes)))
    rng.shuffle(sizes)
    wk = image_key({"bench": "verify_local", "size": size, "seed": seed})
    t0 = time.perf_counter()
    block = rng.integers(0, 256, 64 << 20, dtype=np.uint8)  # refreshed per segment by cheap xor
    with ImageWriter(root, wk, 0, expected_bytes=sum(sizes)) as w:
        for i, n in enumerate(sizes):
            slot = w.add_segment(f"seg{i:05d}", "uint8", [n], "native.v1", n, f"part{i % 8}.bin")
            key = np.uint8(rng.integers(1, 256))
            for off in range(0, n, len(block)):
                piece = block[: min(len(block), n - off)] ^ key
                w.write(slot, off, piece)
        path = w.publish(
            {"family": "bench", "key": image_key({"w": wk}), "key_inputs": {}, "world": 1, "plan": {}}
        )
    return path, time.perf_counter() - t0


def drop_cache(files: list[Path]) -> None:
    """Evict the files from the page cache (they are clean: the writer fsynced them)."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def plain_read(files: list[Path], jobs: int, block: int = dg.BLOCK) -> int:
    """Read every byte with `jobs` threads, 64 MiB ranges each read in `block`-sized preads; returns bytes."""
    local = threading.local()
    tasks = []
    fds = [os.open(f, os.O_RDONLY) for f in files]
    for fd, f in zip(fds, files, strict=True):
        size = f.stat().st_size
        tasks += [(fd, off, min(dg.BLOCK, size - off)) for off in range(0, size, dg.BLOCK)]

    piece = min(block, dg.BLOCK)

    def read(t):
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(piece)
        fd, off, n = t
        view = memoryview(buf)
        os.posix_fadvise(fd, off, n, os.POSIX_FADV_WILLNEED)
        got = 0
        while got < n:
            got += os.preadv(fd, [view[: min(piece, n - got)]], off + got)
        return n

    try:
        with ThreadPoolExecutor(jobs) as pool:
            return sum(pool.map(read, tasks))
    finally:
        for fd in fds:
            os.close(fd)


def timed(fn, repeats: int, before=None) -> tuple[float, float]:
    """(median seconds, median GB/s) of fn() -> bytes."""
    secs, rates = [], []
    for _ in range(repeats):
        if before:
            before()
        t0 = time.perf_counter()
        n = fn()
        dt = time.perf_counter() - t0
        secs.append(dt)
        rates.append(n / dt / GB)
    return statistics.median(secs), statistics.median(rates)


def digest_speeds(nbytes: int, repeats: int, jobs: int) -> list[tuple[str, float]]:
    """In-memory GB/s of each hash over one random buffer."""
    import blake3

    buf = np.random.default_rng(1).integers(0, 256, nbytes, dtype=np.uint8)
    mv = memoryview(buf)
    pool = ThreadPoolExecutor(jobs)
    chunk64 = [mv[i : i + (64 << 20)] for i in range(0, nbytes, 64 << 20)]
    cases = {
        "blake3, 1 thread": lambda: blake3.blake3(mv).digest(),
        "blake3, max_threads=AUTO": lambda: blake3.blake3(mv, max_threads=blake3.blake3.AUTO).digest(),
        f"blake3, tfc 4 MiB chunks on {jobs} threads (digest_bytes)": lambda: dg.digest_bytes(mv),
        "sha256, 1 thread": lambda: hashlib.sha256(mv).digest(),
        f"sha256, 64 MiB chunks on {jobs} threads": lambda: list(
            pool.map(lambda c: hashlib.sha256(c).digest(), chunk64)
        ),
    }
    try:
        import xxhash

        cases["xxh3_64, 1 thread"] = lambda: xxhash.xxh3_64(mv).digest()
        cases["xxh3_128, 1 thread"] = lambda: xxhash.xxh3_128(mv).digest()
        cases[f"xxh3_128, 64 MiB chunks on {jobs} threads"] = lambda: list(
            pool.map(lambda c: xxhash.xxh3_128(c).digest(), chunk64)
        )
    except ImportError:
        pass
    out = []
    for name, fn in cases.items():
        fn()  # warm-up
        out.append((name, timed(lambda fn=fn: (fn(), nbytes)[1], repeats)[1]))
    pool.shutdown()
    return out


def hardware() -> str:
    """CPU model, cores, memory and filesystem in one line each."""
    model = "?"
    with __import__("contextlib").suppress(Exception):
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}; {os.cpu_count()} logical CPUs; {mem:.0f} GiB RAM; {platform.platform()}"


def damon_reclaim() -> bool:
    """Whether a DAMON pageout scheme runs (it evicts idle page cache, so 'warm' decays within seconds)."""
    return any(
        p.read_text().strip() == "pageout"
        for p in Path("/sys/kernel/mm/damon/admin/kdamonds").glob("*/contexts/*/schemes/*/action")
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=4.0, help="image size in GB (1e9 bytes)")
    ap.add_argument(
        "--out", type=Path, default=Path(__file__).parent / "results" / "verify" / "verify_local.md"
    )
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to build the image (default: a temp folder)"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--digest-mb", type=int, default=1024, help="buffer size for the in-memory digest speeds")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="tfc-verify-bench-", dir=args.dir))
    try:
        size = int(args.size_gb * GB)
        path, build_s = build_image(work, size)
        m = RankManifest.load(path)
        files = [path / f.name for f in m.files]
        payload = sum(s.length for s in m.segments)
        print(
            f"built {payload / GB:.2f} GB in {len(m.segments)} segments, {len(files)} files, {build_s:.1f} s",
            file=sys.stderr,
        )

        def cold():
            drop_cache(files)

        def verify(mode):
            def run():
                r = verify_image(path, mode, jobs=args.jobs)
                assert r.ok, r.problems[:3]
                return r.bytes_checked

            return run

        def warm():
            plain_read(files, args.jobs, dg.PIECE)  # this VM's DAMON reclaim evicts idle page cache: re-warm

        rows = [
            ("plain parallel read, warm", *timed(lambda: plain_read(files, args.jobs), args.repeats, warm)),
            (
                "plain parallel read (512 KiB preads), warm",
                *timed(lambda: plain_read(files, args.jobs, dg.PIECE), args.repeats, warm),
            ),
            ("verify --full, warm", *timed(verify("full"), args.repeats, warm)),
            ("verify --sample, warm", *timed(verify("sample"), args.repeats, warm)),
            ("plain read, 1 thread, warm", *timed(lambda: plain_read(files, 1), args.repeats, warm)),
            ("plain parallel read, cold", *timed(lambda: plain_read(files, args.jobs), args.repeats, cold)),
            (
                "plain parallel read (512 KiB preads), cold",
                *timed(lambda: plain_read(files, args.jobs, dg.PIECE), args.repeats, cold),
            ),
            ("verify --full, cold", *timed(verify("full"), args.repeats, cold)),
            ("verify --sample, cold", *timed(verify("sample"), args.repeats, cold)),
        ]
        warm()
        t0 = time.perf_counter()
        cli = subprocess.run(
            [sys.executable, "-m", "tfc", "verify", "--full", str(path.parent)],
            capture_output=True,
            text=True,
        )
        cli_s = time.perf_counter() - t0
        sample = verify_image(path, "sample")
        digests = digest_speeds(args.digest_mb << 20, args.repeats, args.jobs)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    r = {name: rate for name, _, rate in rows}
    read_warm = max(r["plain parallel read, warm"], r["plain parallel read (512 KiB preads), warm"])
    read_cold = max(r["plain parallel read, cold"], r["plain parallel read (512 KiB preads), cold"])
    import blake3

    lines = [
        "# verify --full vs plain reading, and digest speeds",
        "",
        f"Command: `python benchmarks/verify_local.py --size-gb {args.size_gb:g} --repeats {args.repeats} --jobs {args.jobs}"
        f"{' --dir ' + str(args.dir) if args.dir else ''} --out {args.out}`",
        "",
        f"Hardware: {hardware()}. Python {platform.python_version()}, blake3 {blake3.__version__}, numpy {np.__version__}.",
        "",
        f"Image: {payload / GB:.2f} GB of random payload in {len(m.segments)} segments (5 % small: 1 KiB–1 MiB; the rest "
        f"32–256 MiB) over {len(files)} files, built through ImageWriter in {build_s:.1f} s "
        f"({payload / build_s / GB:.2f} GB/s incl. random generation, streamed digests, fsync). Sample mode hashes "
        f"{sample.bytes_checked / GB:.2f} GB ({100 * sample.bytes_checked / payload:.1f} %). Cold = `posix_fadvise(DONTNEED)` "
        "on every file before each run; warm = every file read once right before each run. GB/s = 1e9 bytes/s of payload hashed (verify) or file bytes read (plain). "
        f"Load average when the run ended: {os.getloadavg()[0]:.2f} (other processes share this machine)."
        + (" DAMON proactive reclaim (pageout) is active on this host." if damon_reclaim() else ""),
        "",
        f"Medians of {args.repeats} runs, {args.jobs} threads:",
        "",
        "| what | median s | median GB/s |",
        "| --- | ---: | ---: |",
        *[f"| {name} | {secs:.3f} | {rate:.2f} |" for name, secs, rate in rows],
        "",
        f"verify --full / faster plain parallel read: warm {r['verify --full, warm'] / read_warm:.2f}x, "
        f"cold {r['verify --full, cold'] / read_cold:.2f}x. "
        f"`tfc verify --full` as a process (warm, incl. start-up): {cli_s:.2f} s, exit {cli.returncode}.",
        "",
        f"In-memory digest speed ({args.digest_mb} MiB buffer, median of {args.repeats}):",
        "",
        "| hash | GB/s |",
        "| --- | ---: |",
        *[f"| {name} | {rate:.2f} |" for name, rate in digests],
        "",
    ]
    lines += [
        "Reading the table: verify re-reads in 512 KiB preads and hashes each piece while it is in cache "
        "(BLAKE3 per 4 MiB chunk, one task per 64 MiB run, `--jobs` threads). Warm, it is bound by the hash "
        "rate of the cores (compare the in-memory rows), not by reading; cold, hashing overlaps the disk.",
        "",
    ]
    if not any(name.startswith("xxh") for name, _ in digests):
        lines.append("xxhash is not installed here, so it is not measured.\n")
    args.out.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
