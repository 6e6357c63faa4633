"""Benchmark: time to weights resident on an H200 for the `auto`, `mmap`, `ring` and `register` upload paths.

Run on the GPU machine from the repository root:

    python3 benchmarks/boot_h200.py --image DIR --out DIR [--reps 3] [--make-gb 24] [--budget-s 225]

DIR is a rank folder (manifest.json), a folder written by `--make-gb` (bench_segments.json: a
synthetic rank of per-layer files with segments at 4 KiB offsets), or any folder of *.bin files.
Measured in the same run: the floors (image bytes / pinned H2D bandwidth warm; image bytes /
parallel-pread disk bandwidth cold), the host side of the warm path (memcpy out of a fresh mmap with
16 threads, pinned staging allocation: benchmarks/boot_host.py), warm boots (`auto`, a sweep of the
`mmap` path, the best known `ring` and `register` configurations), cold boots (page cache dropped:
`auto`, `register`), whole `tfc load --json` processes warm with and without the staging prefault
(`TFC_PREFAULT`), and `safetensors.torch.load_file(..., device="cuda")` of an equivalent
safetensors file, warm. A boot is timed from reading the segment list to `torch.cuda.synchronize()`
after the upload: arena plan, device allocation, the upload (page-cache probe, staging allocation,
copies, unmapping, freeing the staging); each boot starts with torch's pinned cache emptied, as a
fresh process does. Stages that would not fit in --budget-s are skipped (and say so). Writes
boot_h200.json and boot_h200.md into --out (commit them under benchmarks/results/boot/) and prints a short
table last. Needs torch with CUDA (`--host-only` runs boot_host.py's part without it); imports only
tfc.runtime (safetensors for the baseline).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET_WARM, TARGET_COLD, TARGET_ST = 1.25, 1.10, 4.0


def _import_tfc():
    """Import tfc.runtime from an installed package, or map the repository folders when not installed."""
    try:
        import tfc.runtime.boot.upload
    except ImportError:
        sys.path.insert(0, str(ROOT))
        import tfc

        for name in ("runtime",):
            spec = importlib.util.spec_from_file_location(
                f"tfc.{name}", ROOT / name / "__init__.py", submodule_search_locations=[str(ROOT / name)]
            )
            module = importlib.util.module_from_spec(spec)
            sys.modules[f"tfc.{name}"] = module
            spec.loader.exec_module(module)
            setattr(tfc, name, module)
    from tfc.runtime.boot import arena, upload

    return arena, upload


# -- the image --------------------------------------------------------------------------------


def make_image(folder: Path, gb: float) -> None:
    """A synthetic rank: 43 layer files plus top.bin, segments of mixed sizes at 4 KiB offsets."""
    import random

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    noise = memoryview(os.urandom(96 << 20))
    total = int(gb * 1e9)
    files = [f"L{i:02d}.bin" for i in range(43)] + ["top.bin"]
    per_file = total // len(files)
    segments = []
    for fname in files:
        off, left = 0, per_file
        while left > 0:  # an expert table, its scales and natives, like a real layer
            n = min(left, rng.choice([300 << 20, 120 << 20, 9 << 20, 70_001, 4_096 * 33 + 2]))
            segments.append({"name": f"{fname}.{len(segments)}", "file": fname, "offset": off, "length": n})
            off = -(-(off + n) // 4096) * 4096
            left -= n
    by_file: dict[str, list] = {}
    for s in segments:
        by_file.setdefault(s["file"], []).append(s)

    def write(fname: str) -> None:
        fd = os.open(folder / fname, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            for s in by_file[fname]:
                pos, end = s["offset"], s["offset"] + s["length"]
                while pos < end:
                    n = min(end - pos, 32 << 20)
                    start = (pos * 7919) % (len(noise) - n)
                    os.pwrite(fd, noise[start : start + n], pos)
                    pos += n
            os.ftruncate(fd, -(-os.fstat(fd).st_size // 4096) * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)

    _parallel(files, write, 8)
    (folder / "bench_segments.json").write_text(json.dumps({"segments": segments}))


def image_items(folder: Path, UploadItem) -> tuple[list, str]:
    """Upload items of the image folder, and where they came from."""
    for name in ("manifest.json", "bench_segments.json"):
        if (folder / name).exists():
            segs = json.loads((folder / name).read_text())["segments"]
            return [UploadItem(s["name"], folder / s["file"], s["offset"], s["length"]) for s in segs], name
    files = sorted(folder.glob("*.bin"))
    return [UploadItem(f.name, f, 0, f.stat().st_size) for f in files], "*.bin files"


def _parallel(items, fn, threads: int) -> None:
    it = iter(list(items))
    lock = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        while True:
            with lock:
                x = next(it, None)
            if x is None:
                return
            try:
                fn(x)
            except BaseException as e:
                errors.append(e)
                return

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


# -- page cache -------------------------------------------------------------------------------


def drop_cache(files: list[Path]) -> dict:
    """Evict the files from the page cache: fadvise(DONTNEED) on each, and try /proc/sys/vm/drop_caches."""
    os.sync()
    fadvise_ok = True
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except OSError:
            fadvise_ok = False
        finally:
            os.close(fd)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        drop = "ok"
    except OSError as error:
        drop = f"failed: {error.strerror}"
    return {
        "fadvise_dontneed": "ok" if fadvise_ok else "failed",
        "drop_caches": drop,
        "resident": resident(files),
    }


def resident(files: list[Path]) -> float:
    """Fraction of the files' pages in the page cache (the runtime's own mincore probe)."""
    from tfc.runtime.boot.pages import resident_fraction

    return resident_fraction(files)


def warm_cache(files: list[Path]) -> None:
    """Read every file once so the page cache holds it."""

    def read(f: Path) -> None:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(64 << 20):
                pass

    _parallel(files, read, 8)


# -- floors -----------------------------------------------------------------------------------


def pinned_h2d_gbps(torch, nbytes: int = 2 << 30, reps: int = 5) -> dict:
    """Host-to-device bandwidth from pinned memory (best and median of `reps` copies)."""
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    src.fill_(7)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
    del src, dst
    torch.cuda.empty_cache()
    return {"best": round(max(rates), 2), "median": round(statistics.median(rates), 2), "bytes": nbytes}


def dma_probe(torch, nbytes: int = 8 << 30, ring: int = 128 << 20) -> list[dict]:
    """The copy engine alone, as the staged upload drives it: `nbytes` of host-to-device copies out of a pinned
    ring of `ring` bytes (no host copy into it), piece by piece round-robin over S streams, for several S and
    piece sizes; GB/s from the first issue to the last completion."""
    src = torch.empty(ring, dtype=torch.uint8, pin_memory=True)
    src.fill_(3)
    dst = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    out = []
    for streams, piece in ((2, 128 << 20), (1, 4 << 20), (2, 4 << 20), (4, 4 << 20), (16, 4 << 20),
                           (16, 2 << 20), (16, 8 << 20)):  # fmt: skip
        ss = [torch.cuda.Stream() for _ in range(streams)]
        rates = []
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(nbytes // piece):
                with torch.cuda.stream(ss[i % streams]):
                    d0, s0 = (i * piece) % dst.numel(), (i * piece) % ring
                    dst[d0 : d0 + piece].copy_(src[s0 : s0 + piece], non_blocking=True)
            torch.cuda.synchronize()
            rates.append(nbytes / (time.perf_counter() - t0) / 1e9)
        out.append({"streams": streams, "piece_mib": piece >> 20, "gbps": [round(r, 2) for r in rates]})
        print(
            f"dma probe: {streams} streams x {piece >> 20} MiB pieces: {out[-1]['gbps']} GB/s",
            file=sys.stderr,
        )
    del src, dst
    torch.cuda.empty_cache()
    return out


def disk_read_gbps(files: list[Path], threads: int, request: int = 64 << 20) -> float:
    """Parallel pread of every file (page cache dropped by the caller) into plain buffers."""
    work = [
        (f, off, min(request, f.stat().st_size - off))
        for f in files
        for off in range(0, f.stat().st_size, request)
    ]
    total = sum(n for _, _, n in work)
    local = threading.local()

    def read(w) -> None:
        f, off, n = w
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(request)
        fd = os.open(f, os.O_RDONLY)
        try:
            os.preadv(fd, [memoryview(buf)[:n]], off)
        finally:
            os.close(fd)

    t0 = time.perf_counter()
    _parallel(work, read, threads)
    return total / (time.perf_counter() - t0) / 1e9


# -- boots ------------------------------------------------------------------------------------

CFG_KEYS = ("threads", "slot_bytes", "slots_per_thread", "prefault", "drop", "issuer", "streams", "pinning",
            "copier", "pool")  # fmt: skip


def _pool(cfg: dict) -> bool:
    """With cfg's `pool` set, fault in the mmap path's staging before the timer, as `tfc load` does while torch
    imports (runtime/boot/staging_pool.py); whether a pool was made."""
    if not cfg.get("pool"):
        return False
    import boot_variants
    from tfc.runtime.boot import staging_pool

    st = boot_variants.staging({k: v for k, v in cfg.items() if k != "pool"})
    pool = staging_pool.prefault(st.slot_bytes, st.threads * st.slots_per_thread)
    if pool is not None:
        pool.taken()  # waits for the fill thread: the faults are paid before the timer starts
    return pool is not None


def boot_once(torch, arena_mod, upload_mod, folder: Path, method: str, cfg: dict) -> dict:
    """Open the segment list, allocate the arena, upload, synchronise: time to weights resident (cfg: the
    staging, boot_variants.plan's keys, and `pool`)."""
    import boot_variants
    from tfc.runtime.boot import staging_pool
    from tfc.runtime.boot.upload_files import empty_host_cache

    pooled = _pool(cfg)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    items, _ = image_items(folder, arena_mod.UploadItem)
    plan = arena_mod.plan_arena(items)
    t_open = time.perf_counter()
    arena = arena_mod.DeviceArena(plan, "cuda")
    torch.cuda.synchronize()
    t_alloc = time.perf_counter()
    try:
        t_plan = time.perf_counter()
        how = boot_variants.plan(upload_mod, arena, method, {k: v for k, v in cfg.items() if k != "pool"})
        report = upload_mod.run_upload(arena, how, started=t_plan)
        torch.cuda.synchronize()
        t_end = time.perf_counter()
    finally:
        if pooled:
            staging_pool.release()
    out = {
        "label": method,
        **cfg,
        "method": report.method,
        "threads": report.threads,
        "bytes": plan.nbytes,
        "seconds": t_end - t0,
        "open_s": t_open - t0,
        "alloc_s": t_alloc - t_open,
        "upload_s": report.seconds,
        "read_s": report.read_seconds,
        "staging_s": report.staging_seconds,
        "steps": report.steps,
        "config": report.config,
    }
    out["gbps"] = plan.nbytes / out["seconds"] / 1e9
    arena.release()
    del arena
    torch.cuda.empty_cache()
    empty_host_cache(torch)  # the next boot pays for its pinned slots, as a fresh process does
    return out


def boot_median(torch, arena_mod, upload_mod, folder: Path, method: str, cfg: dict, reps: int) -> dict:
    """The median of `reps` warm boots, with every run's seconds."""
    runs = [boot_once(torch, arena_mod, upload_mod, folder, method, cfg) for _ in range(reps)]
    med = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    med["all_seconds"] = [round(r["seconds"], 4) for r in runs]
    print(f"warm {method} {cfg}: {med['seconds']:.3f} s ({med['gbps']:.1f} GB/s)", file=sys.stderr)
    return med


def mmap_sweep() -> tuple[list[dict], list[dict]]:
    """The mmap path's grid (threads x staging), then one change at a time around the grid's best.

    Run 2 swept 8-16 threads, 4-32 MiB slots, 2-3 slots a thread, prefault and drop options
    (boot_h200_run2.md); this grid keeps the neighbourhood of its best, so there is time for 3 reps.
    """
    grid = [dict(threads=t, slot_bytes=s << 20, slots_per_thread=2) for t in (12, 16) for s in (8, 16)]
    around = [dict(issuer="single", streams=2), dict(pinning="torch")]
    return grid, around


def write_safetensors(items: list, path: Path) -> int:
    """A safetensors file holding the image's segments as U8 tensors (same bytes, same sizes)."""
    header, pos = {}, 0
    for i, it in enumerate(items):
        header[f"t{i}"] = {"dtype": "U8", "shape": [it.length], "data_offsets": [pos, pos + it.length]}
        pos += it.length
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(len(text).to_bytes(8, "little") + text)
        for it in items:
            with open(it.path, "rb") as src:
                done = 0
                while done < it.length:
                    done += os.copy_file_range(src.fileno(), out.fileno(), it.length - done, it.offset + done)
        out.flush()
        os.fsync(out.fileno())
    return pos


def safetensors_warm(torch, path: Path, reps: int) -> dict:
    from safetensors.torch import load_file

    warm_cache([path])
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tensors = load_file(str(path), device="cuda")
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        del tensors
        torch.cuda.empty_cache()
    return {"seconds": statistics.median(times), "all": times}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--image", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--make-gb", type=float, default=0.0, help="write a synthetic image of this size first")
    ap.add_argument("--reps", type=int, default=3, help="warm repetitions (median)")
    ap.add_argument(
        "--budget-s", type=float, default=225.0, help="skip stages that would end later than this"
    )
    ap.add_argument("--no-cold", action="store_true")
    ap.add_argument("--no-safetensors", action="store_true")
    ap.add_argument("--host-only", action="store_true", help="only the host copy part (no CUDA needed)")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="no sweeps: warm auto, the mmap default and --extra-mmap (cold and safetensors still run unless --no-cold / --no-safetensors)",
    )
    ap.add_argument(
        "--extra-mmap",
        default="[]",
        help='JSON list of further warm mmap configurations, e.g. [{"copier": "native"}]',
    )
    ap.add_argument("--no-process", action="store_true", help="skip the whole tfc load processes")
    ap.add_argument(
        "--cold-more",
        default="[]",
        help='JSON list of further cold [method, options] boots, e.g. [["ring", {"threads": 16}]]; every cold '
        "boot then follows its own disk probe, and the disk is probed again after the last",
    )
    ap.add_argument(
        "--dma-probe", action="store_true", help="time the copy engine alone over streams and pieces"
    )
    args = ap.parse_args()
    args.extra_mmap = json.loads(args.extra_mmap)
    args.cold_more = [tuple(m) for m in json.loads(args.cold_more)]
    start = time.perf_counter()
    arena_mod, upload_mod = _import_tfc()
    import boot_host

    if args.make_gb and not any(args.image.glob("*.bin")):
        t0 = time.perf_counter()
        make_image(args.image, args.make_gb)
        print(
            f"made a {args.make_gb} GB synthetic image in {time.perf_counter() - t0:.1f} s", file=sys.stderr
        )
    items, source = image_items(args.image, arena_mod.UploadItem)
    files = sorted({it.path for it in items})
    image_bytes = arena_mod.plan_arena(items).nbytes
    if args.host_only:
        warm_cache(files)
        print(json.dumps({"bytes": image_bytes, "host_copy": boot_host.host_copies(files, 16, 1)}, indent=1))
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("boot_h200: needs CUDA (--host-only runs the host part)")
    args.out.mkdir(parents=True, exist_ok=True)
    res: dict = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "hardware": {
            "gpu": torch.cuda.get_device_name(0),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        },
        "image": {"path": str(args.image), "source": source, "files": len(files), "segments": len(items),
                  "bytes": image_bytes},
        "skipped": [],
    }  # fmt: skip
    print(
        f"image: {image_bytes / 1e9:.2f} GB in {len(files)} files, {len(items)} segments ({source})",
        file=sys.stderr,
    )

    def stop(signum, frame):
        raise SystemExit(f"boot_h200: signal {signum}, writing what was measured")

    signal.signal(signal.SIGTERM, stop)
    try:
        measure(torch, arena_mod, upload_mod, boot_host, args, res, files, items, image_bytes, start)
    finally:
        res["wall_s"] = round(time.perf_counter() - start, 1)
        report(res, args.out)


def sweep(warm, res: dict) -> None:
    """The mmap grid and its neighbours, the best known ring configurations and the register path, warm."""
    grid, around = mmap_sweep()
    done = [r for r in (warm("mmap", cfg) for cfg in grid) if r]
    if done:
        best = min(done, key=lambda r: r["seconds"])
        base = {k: best[k] for k in ("threads", "slot_bytes", "slots_per_thread")}
        for change in around:
            warm("mmap", {**base, **change})
    mmap_runs = [r for r in res["warm"] if r["label"] == "mmap"]
    if mmap_runs:
        best = min(mmap_runs, key=lambda r: r["seconds"])
        res["best_mmap"] = best["config"]
    for cfg in (dict(threads=8, slot_bytes=4 << 20, slots_per_thread=4),
                dict(threads=16, slot_bytes=16 << 20, slots_per_thread=2)):  # fmt: skip
        warm("ring", cfg)
    warm("register", dict(threads=4))  # 256 MiB windows (upload.WINDOW_BYTES)


def measure(torch, arena_mod, upload_mod, boot_host, args, res, files, items, image_bytes, start) -> None:
    """Every stage in order of importance, each skipped when it would not fit in the budget."""
    from tfc.runtime.boot import upload_mmap

    deadline = start + args.budget_s
    gb = image_bytes / 1e9
    cold_est = (
        0.0 if args.no_cold else (4 + bool(args.cold_more) * 3 + 2 * len(args.cold_more)) * gb / 1.7 + 5
    )
    # two disk floors and two cold boots (1.7 GB/s disk); with --cold-more a probe before each boot, its boots and
    # a last probe
    st_est = 0.0 if args.no_safetensors else 1.6 * gb + 5  # write at 1.3 GB/s, then three loads

    def fits(seconds: float, what: str, reserve: float = 0.0) -> bool:
        ok = time.perf_counter() + seconds + reserve <= deadline
        if not ok:
            res["skipped"].append(what)
            print(f"skipped (time budget): {what}", file=sys.stderr)
        return ok

    res["defaults"] = {"WARM_MMAP": dataclasses.asdict(upload_mmap.WARM_MMAP),
                       "WARM_NATIVE": dataclasses.asdict(upload_mmap.WARM_NATIVE), "WARM_RING": upload_mod.WARM_RING,
                       "COLD_RING": upload_mod.COLD_RING, "WARM_FRACTION": upload_mod.WARM_FRACTION}  # fmt: skip
    res["h2d_pinned_gbps"] = pinned_h2d_gbps(torch)
    res["floor_warm_s"] = image_bytes / (res["h2d_pinned_gbps"]["best"] * 1e9)
    res["staging_alloc"] = boot_host.staging_alloc(torch, 32, 8 << 20, 16)
    if args.dma_probe:
        res["dma_probe"] = dma_probe(torch)
    warm_cache(files)
    res["warm_resident"] = resident(files)
    res["host_copy"] = boot_host.host_copies(files, 16)

    reps = max(1, args.reps)
    per_boot = reps * (res["floor_warm_s"] * 2.5 + 0.3)  # a guess for a warm config, kept on the safe side
    reserve = cold_est + st_est
    res["warm"] = []

    def warm(method: str, cfg: dict) -> dict | None:
        if not fits(per_boot, f"warm {method} {cfg}", reserve):
            return None
        run = boot_median(torch, arena_mod, upload_mod, args.image, method, cfg, reps)
        res["warm"].append(run)
        return run

    # the native copier is built here, not inside a timed boot
    res["native_ready"] = upload_mmap.native_ready() or "yes"
    warm("auto", {})
    if not args.no_process and fits(
        2 * reps * (res["floor_warm_s"] * 2.5 + 4.0), "whole tfc load processes", reserve
    ):
        res["load_process"] = load_process(args.image, reps)
    if args.quick:
        warm("mmap", {})
        for cfg in args.extra_mmap:  # alternating with the default, so drift between them shows
            warm("mmap", cfg)
            warm("mmap", {})
        res["skipped"].append("sweeps, ring and register (--quick)")
    else:
        sweep(warm, res)

    if not args.no_cold and fits(cold_est, "cold boots and the disk floor", st_est):
        res["cold"] = []
        disk = []
        for threads in (8, 16):
            res[f"drop_before_disk_{threads}"] = drop_cache(files)
            disk.append(disk_read_gbps(files, threads))
        res["disk_read_gbps"] = {"8_threads": round(disk[0], 3), "16_threads": round(disk[1], 3)}
        res["floor_cold_s"] = image_bytes / (max(disk) * 1e9)
        for method, cfg in (
            ("auto", {}),
            ("register", dict(threads=4)),
            *args.cold_more,
        ):
            probe = None
            if args.cold_more:  # the disk drifts within a run: probe it right before each boot as well
                drop_cache(files)
                probe = round(disk_read_gbps(files, 8), 3)
            drop = drop_cache(files)
            run = boot_once(torch, arena_mod, upload_mod, args.image, method, cfg)
            run["drop_cache"] = drop
            if probe:
                run["disk_before_gbps"] = probe
                run["vs_disk_before"] = round(run["seconds"] / (image_bytes / (probe * 1e9)), 3)
            res["cold"].append(run)
            print(
                f"cold {method} {cfg}: {run['seconds']:.3f} s (resident before {drop['resident']}; "
                f"{run['config']})",
                file=sys.stderr,
            )
        if args.cold_more:  # the disk again: how far it drifted while the cold boots ran
            res["drop_before_disk_after"] = drop_cache(files)
            res["disk_read_gbps"]["8_threads_after"] = round(disk_read_gbps(files, 8), 3)

    if not args.no_safetensors and fits(st_est, "safetensors baseline"):
        try:
            import safetensors  # noqa: F401

            st_path = args.image.resolve().parent / "boot_h200_equivalent.safetensors"  # beside the image
            free = os.statvfs(st_path.parent).f_bavail * os.statvfs(st_path.parent).f_frsize
            if free < image_bytes + (2 << 30):
                res["safetensors"] = {
                    "skipped": f"only {free / 1e9:.1f} GB free for a {image_bytes / 1e9:.1f} GB file"
                }
            else:
                try:
                    write_safetensors(items, st_path)
                    res["safetensors"] = safetensors_warm(torch, st_path, reps)
                finally:
                    st_path.unlink(missing_ok=True)
        except ImportError:
            res["safetensors"] = {"skipped": "safetensors is not installed"}


def load_process(image: Path, reps: int, timeout: float = 120.0) -> dict:
    """Whole `tfc load IMAGE --json` processes, warm, with the staging prefault (TFC_PREFAULT=1) and without:
    per setting the median process wall time and the median of each phase (ms), and every run."""
    out: dict = {}
    for prefault in ("1", "0"):
        runs = []
        for _ in range(reps):
            env = {**os.environ, "TFC_PREFAULT": prefault}
            t0 = time.perf_counter()
            # from a neutral folder: in the repository root `-m tfc` would find the source tree, not the install
            proc = subprocess.run([sys.executable, "-m", "tfc", "load", str(image.resolve()), "--json"], env=env,
                                  capture_output=True, text=True, timeout=timeout, check=False,
                                  cwd=tempfile.gettempdir())  # fmt: skip
            wall = time.perf_counter() - t0
            if proc.returncode:
                runs.append({"error": proc.stderr.strip()[-300:]})
                continue
            doc = json.loads(proc.stdout.strip().splitlines()[-1])
            phases = {k: v["ms"] for k, v in doc.items() if isinstance(v, dict) and "ms" in v}
            runs.append(
                {"process_s": round(wall, 3), "phases_ms": phases, "upload_steps": doc.get("upload_steps")}
            )
        ok = [r for r in runs if "error" not in r]
        med = {"process_s": statistics.median(r["process_s"] for r in ok)} if ok else {}
        for name in ok[0]["phases_ms"] if ok else ():
            med[name] = statistics.median(r["phases_ms"].get(name, 0.0) for r in ok)
        out[f"prefault_{prefault}"] = {"median": med, "runs": runs}
        print(f"tfc load, TFC_PREFAULT={prefault}: {med}", file=sys.stderr)
    return out


def _cfg(r: dict) -> str:
    """A run's configuration, short: sizes in MiB, options only where they differ from the default."""
    parts = []
    for k in CFG_KEYS:
        if k in r and r[k] is not None:
            v = r[k]
            parts.append(f"{k}={v >> 20}M" if k.endswith("bytes") else f"{k}={v}")
    return ", ".join(parts) or "-"


def report(res: dict, out: Path) -> None:
    """Write JSON and markdown, print the table."""
    rows = []
    st = res.get("safetensors", {}).get("seconds")
    for kind, floor, target in (
        ("warm", res.get("floor_warm_s"), TARGET_WARM),
        ("cold", res.get("floor_cold_s"), TARGET_COLD),
    ):
        if not res.get(kind) or not floor:
            continue
        for label in ("auto", "mmap", "ring", "register"):
            mine = [r for r in res[kind] if r["label"] == label]
            if not mine:
                continue
            r = min(mine, key=lambda r: r["seconds"])
            name = f"auto ({r['method']})" if label == "auto" else label
            cfg = r["config"] if label == "auto" else _cfg(r)
            ratio = r["seconds"] / floor
            line = [kind, name, cfg, f"{r['seconds']:.3f}", f"{r['gbps']:.1f}", f"{floor:.3f}", f"{ratio:.2f}x",
                    f"<= {target}x", "yes" if ratio <= target else "NO", f"{r['staging_s']:.3f}"]  # fmt: skip
            if kind == "warm" and st:
                line.append(f"{st / r['seconds']:.1f}x")
            rows.append(line)
    head = ["cache", "method", "config (best median)", "seconds", "GB/s", "floor s", "vs floor", "target",
            "met", "staging s", "vs safetensors"]  # fmt: skip
    md = ["# Boot: time to weights resident (H200)", "", f"Command: `{res['command']}`  ", f"Date: {res['date']}  ",
          f"Hardware: {json.dumps(res['hardware'])}  ", f"Image: {json.dumps(res['image'])}  ",
          f"Benchmark wall time: {res.get('wall_s')} s; skipped for the time budget: {res.get('skipped') or 'nothing'}",
          "",
          "A boot is timed from reading the segment list to `torch.cuda.synchronize()` after the upload: arena plan, "
          "device allocation, the upload (page-cache probe for auto, staging allocation, copies, unmapping, freeing "
          "the staging); torch's pinned cache is emptied before each boot, as in a fresh process. Warm: median of "
          "--reps boots with the image in the page cache; cold: one boot after dropping it. Floors: image bytes / "
          "pinned H2D bandwidth (warm), image bytes / parallel-pread disk bandwidth (cold). staging s: seconds "
          "spent allocating pinned staging, summed over the threads (it overlaps the copies).", "",
          f"Pinned H2D: {res.get('h2d_pinned_gbps')}; disk read (cold, parallel pread): {res.get('disk_read_gbps')} GB/s; "
          f"safetensors load_file warm: {st if st is not None else res.get('safetensors')} s "
          f"(target: >= {TARGET_ST}x faster)", "",
          "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]  # fmt: skip
    md += ["| " + " | ".join(r + [""] * (len(head) - len(r))) + " |" for r in rows]
    sweep = [r for r in res.get("warm", []) if r["label"] == "mmap"]
    if sweep:
        floor = res["floor_warm_s"]
        md += ["", f"Warm `mmap` sweep (defaults: {res['defaults']['WARM_MMAP']}; best: {res.get('best_mmap')}):", "",
               "| config | median s | GB/s | vs floor | read s | staging s | all s |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        md += [f"| {_cfg(r)} | {r['seconds']:.3f} | {r['gbps']:.1f} | {r['seconds'] / floor:.2f}x | "
               f"{r['read_s']:.3f} | {r['staging_s']:.3f} | {r['all_seconds']} |" for r in sweep]  # fmt: skip
    if res.get("host_copy"):
        md += ["", "Host copy out of a fresh read-only mmap of the (cached) image into per-thread 8 MiB buffers "
               "(benchmarks/boot_host.py; best of 2; munmap timed apart):", "",
               "| threads | copier | prefault | drop | GB/s | munmap s |", "|---|---|---|---|---|---|"]  # fmt: skip
        md += [f"| {r['threads']} | {r['copier']} | {r['prefault']} | {r['drop']} | {r['gbps']} | {r['munmap_s']} |"
               for r in res["host_copy"]]  # fmt: skip
    if res.get("staging_alloc"):
        md += ["", "Pinned staging allocation, 32 slots of 8 MiB (`boot_variants.slot`; free timed apart):", "",
               "| pinning | threads | seconds | ms/GiB | free s |", "|---|---|---|---|---|"]  # fmt: skip
        md += [f"| {r['pinning']} | {r['threads']} | {r['seconds']} | {r['ms_per_gib']} | {r['free_s']} |"
               for r in res["staging_alloc"]]  # fmt: skip
    if res.get("load_process"):
        md += ["", "Whole `tfc load IMAGE --json` processes, warm (medians; ms per phase, process seconds; the "
               "upload phase includes staging, which the prefault moves into the init phase's torch import):", "",
               "| TFC_PREFAULT | process s | init ms | open ms | alloc ms | upload ms | staging ms (summed) | "
               "pool s (summed), per process | first byte after s, per process |",
               "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for key, v in res["load_process"].items():
            m = v["median"]
            steps = [r.get("upload_steps") or {} for r in v["runs"] if "error" not in r]
            pool = ", ".join(str(st.get("pool", "")) for st in steps)
            ramp = ", ".join(str(st.get("ramp", "")) for st in steps)
            md.append(f"| {key[-1]} | {m.get('process_s')} | {m.get('init')} | {m.get('open')} | {m.get('alloc')} | "
                      f"{m.get('upload')} | {m.get('staging')} | {pool} | {ramp} |")  # fmt: skip
    probed = [r for r in res.get("cold", []) if r.get("disk_before_gbps")]
    if probed:
        md += ["", "Cold boots, each right after its own disk probe (8 threads; the disk drifts within a run): "
               f"{res['disk_read_gbps']}", "", "| method | config | seconds | disk before GB/s | vs that floor |",
               "|---|---|---|---|---|"]  # fmt: skip
        md += [f"| {r['label']} | {_cfg(r)} | {r['seconds']:.3f} | {r['disk_before_gbps']} | {r['vs_disk_before']}x |"
               for r in probed]  # fmt: skip
    if res.get("dma_probe"):
        md += ["", "The copy engine alone: host-to-device copies out of a 128 MiB pinned ring, round-robin over "
               "streams (`dma_probe`, 8 GiB, two runs):", "", "| streams | piece MiB | GB/s |", "|---|---|---|"]  # fmt: skip
        md += [f"| {r['streams']} | {r['piece_mib']} | {r['gbps']} |" for r in res["dma_probe"]]
    md += ["", "Every run (JSON): boot_h200.json"]
    (out / "boot_h200.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    (out / "boot_h200.md").write_text("\n".join(md) + "\n")
    table = [head, *[r + [""] * (len(head) - len(r)) for r in rows]]
    widths = [max(len(str(x)) for x in col) for col in zip(*table, strict=True)]
    print()
    for r in table:
        print("  ".join(str(x).ljust(w) for x, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
    main()
