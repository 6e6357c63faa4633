#!/usr/bin/env python3
"""Boot: time to weights resident, as `tfc load` runs it, against the floors measured in the same run: warm against
the pinned host-to-device copy of the image's bytes, cold against a plain parallel read of its files; and warm
against `safetensors.torch.load_file(..., device="cuda")` of the same bytes.

    python benchmarks/boot.py [--image IMG/rank0] [--reps 3] [--no-cold] [--no-safetensors] [--json]

IMG: any prepared image's rank folder (default: `tfc fixture flash-random --layers 4` prepared under --work, 22 GB).
Warm: the image in the page cache, --reps whole `tfc load IMAGE --json` processes; the figure is the median of
their `upload` phase over image bytes / pinned H2D rate. Cold: the page cache dropped (root drops it for all;
otherwise posix_fadvise per file), a parallel pread of the files (8 threads, 64 MiB requests) for the disk's
rate, dropped again, one `tfc load` process; its upload phase over image bytes / that rate. safetensors: the
segments written as one U8 tensor each into a file beside the image (its size in free disk needed), loaded warm
--reps times; the figure is load_file's median over the `tfc load` processes' open + alloc + upload phases.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c
from decode import open_image


def image_segments(image: Path) -> tuple[list, list[Path], int]:
    """(segments, data files, bytes) of a rank folder."""
    from tfc.cache.format import RankManifest

    m = RankManifest.load(image)
    return m.segments, sorted({image / s.file for s in m.segments}), sum(s.length for s in m.segments)


def warm(files: list[Path]) -> None:
    def read(f: Path) -> None:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(64 << 20):
                pass

    c.in_threads(files, read, 8)


def load_process(image: Path) -> dict:
    """One whole `tfc load IMAGE --json` process: its wall time and phases (ms)."""
    import time

    t0 = time.perf_counter()
    doc = json.loads(c.tfc("load", str(image.resolve()), "--json", timeout=600))
    phases = {k: v["ms"] for k, v in doc.items() if isinstance(v, dict) and "ms" in v}
    return {"process_s": time.perf_counter() - t0, "phases_ms": phases, "method": doc.get("method")}


def write_safetensors(segments, image: Path, path: Path) -> None:
    """A safetensors file holding the image's segments as U8 tensors (the same bytes, the same sizes)."""
    header, pos = {}, 0
    for i, s in enumerate(segments):
        header[f"t{i}"] = {"dtype": "U8", "shape": [s.length], "data_offsets": [pos, pos + s.length]}
        pos += s.length
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as out:
        out.write(len(text).to_bytes(8, "little") + text)
        for s in segments:
            with open(image / s.file, "rb") as src:
                done = 0
                while done < s.length:
                    done += os.copy_file_range(src.fileno(), out.fileno(), s.length - done, s.offset + done)
        os.fsync(out.fileno())


def safetensors_s(path: Path, reps: int) -> float:
    import time

    import torch
    from safetensors.torch import load_file

    warm([path])
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        tensors = load_file(str(path), device="cuda")
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        del tensors
        torch.cuda.empty_cache()
    return c.median(times)


def main() -> None:
    ap = c.parser(__doc__)
    ap.add_argument("--image", help="a prepared image's rank folder (default: make the Flash slice)")
    ap.add_argument(
        "--work", help="where to make the slice when --image is not given (default: a temporary folder)"
    )
    ap.add_argument("--reps", type=int, default=3, help="warm tfc load processes (median)")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold boot and the disk's rate")
    ap.add_argument("--no-safetensors", action="store_true", help="skip the safetensors baseline")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    device = c.pick_device(args.device)
    c.needs_cuda(device, "boot.py", "its floor is the pinned host-to-device copy")
    c.ensure_tfc()
    run = c.Run("boot", "boot.py", device, args.commit)
    image = open_image(args)
    segments, files, nbytes = image_segments(image)
    h2d = c.pinned_h2d_gbps()
    floor = nbytes / (h2d * 1e9)
    run.data.update(image=str(image), bytes=nbytes, files=len(files), segments=len(segments), h2d_gbps=h2d,
                    floor_warm_s=floor)  # fmt: skip
    warm(files)
    runs = [load_process(image) for _ in range(args.reps)]
    upload = c.median(r["phases_ms"]["upload"] / 1e3 for r in runs)
    staged = c.median(
        sum(r["phases_ms"].get(p, 0.0) for p in ("open", "alloc", "upload")) / 1e3 for r in runs
    )
    run.data["warm"] = runs
    print(
        f"[boot] warm: upload {upload:.3f} s for {nbytes / 1e9:.1f} GB, floor {floor:.3f} s ({h2d:.1f} GB/s)"
    )
    run.metric("boot.warm_upload_vs_floor", upload / floor, "x", "<= 1.25",
               f"image bytes over the pinned host-to-device copy of the same run ({floor:.3f} s at {h2d:.1f} GB/s)")  # fmt: skip
    if not args.no_cold:
        run.data["drop"] = c.drop_page_cache(files)
        disk = c.read_gbps(files, 8)
        c.drop_page_cache(files)
        cold = load_process(image)
        cold_s = cold["phases_ms"]["upload"] / 1e3
        run.data.update(disk_gbps=disk, cold=cold)
        print(f"[boot] cold: upload {cold_s:.3f} s, disk {disk:.2f} GB/s")
        run.metric("boot.cold_vs_disk", cold_s / (nbytes / (disk * 1e9)), "x", "<= 1.10",
                   f"image bytes over a parallel pread of the same files just before ({disk:.2f} GB/s)")  # fmt: skip
    if not args.no_safetensors:
        path = image.resolve().parent / "boot_equivalent.safetensors"
        free = os.statvfs(path.parent).f_bavail * os.statvfs(path.parent).f_frsize
        if free < nbytes + (2 << 30):
            run.data["safetensors"] = f"skipped: {free / 1e9:.1f} GB free for a {nbytes / 1e9:.1f} GB file"
        else:
            try:
                write_safetensors(segments, image, path)
                st = safetensors_s(path, args.reps)
            finally:
                path.unlink(missing_ok=True)
            run.data["safetensors_s"] = st
            print(f"[boot] safetensors load_file: {st:.3f} s against {staged:.3f} s (open + alloc + upload)")
            run.metric("boot.vs_safetensors", st / staged, "x", ">= 4",
                       f"safetensors.torch.load_file(device='cuda') of the same bytes, warm ({st:.2f} s)")  # fmt: skip
    run.finish(args.json)


if __name__ == "__main__":
    main()
