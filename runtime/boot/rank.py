"""Boot a rank: open its image, upload its device tier into a device arena, place its host and NVMe tiers
(runtime/boot/tiers.py), set up the graph cache — timed by phase."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tfc.runtime.boot import cuda_start, staging_pool
from tfc.runtime.boot.arena import DeviceArena, plan_arena
from tfc.runtime.boot.image_open import OpenedImage, open_image, verify_digests
from tfc.runtime.boot.phases import Phases
from tfc.runtime.boot.placement_check import check_room, probe, refuse_off_device
from tfc.runtime.boot.tiers import OffDevice, device_items, place_off_device
from tfc.runtime.boot.upload import UploadReport, upload
from tfc.runtime.graphs.graph_cache import GraphCache, check_same_settings
from tfc.runtime.options import RuntimeOptions
from tfc.runtime.records.reader import RecordConfig

from tfc.errors import TfcError


class DeviceUnavailable(TfcError):
    """The device asked for does not exist on this machine."""


@dataclass
class Booted:
    """A rank whose weights are resident: the image, the arena, the graph cache and the timings."""

    image: OpenedImage
    arena: DeviceArena
    upload: UploadReport
    graphs: GraphCache
    captured: list[Any]
    phases: Phases
    off_device: OffDevice = field(default_factory=OffDevice)  # the host and NVMe tiers

    def close(self) -> None:
        """Release graphs, arena, the tiers off the device and image (in that order: graphs bake in arena
        addresses)."""
        self.graphs.clear()
        self.arena.release()
        self.off_device.release()
        self.image.close()


def pick_device(device: str | None) -> str:
    """`cuda` when asked for and present (or by default when present), else `cpu`."""
    import torch

    has_cuda = torch.cuda.is_available()
    if device in (None, "auto"):
        return "cuda" if has_cuda else "cpu"
    if device.startswith("cuda") and not has_cuda:
        raise DeviceUnavailable(f"--device {device}: this machine has no CUDA device; use --device cpu")
    if not (device == "cpu" or device.startswith("cuda")):
        raise DeviceUnavailable(f"--device {device}: use cuda, cuda:N or cpu")
    return device


def boot(
    path: str | Path,
    rank: int | None = None,
    device: str | None = None,
    method: str | None = None,
    verify: str | None = None,
    options: RuntimeOptions | None = None,
    threads: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    records: RecordConfig | None = None,
) -> Booted:
    """Open, upload and prepare graphs for one rank; `progress(done, total)` is called during upload; `records`
    (default RecordConfig()) says how the NVMe tier is read and cached.

    While torch imports, threads start the device's CUDA context (runtime/boot/cuda_start.py) and, where the upload
    may take the mmap path on a GPU, fault in its staging (runtime/boot/staging_pool.py; unless `options.prefault`
    is off). `options` (default: RuntimeOptions()) also say whether and how many graphs the rank keeps."""
    options = options or RuntimeOptions()
    early = cuda_start.start(device)
    prefaulted = options.prefault and _prefault_staging(device, method, threads)
    try:
        return _boot(
            path, rank, device, method, verify, options, threads, progress, records or RecordConfig()
        )
    finally:
        if prefaulted:
            staging_pool.release()
        if early is not None:
            early.release()


def _prefault_staging(device: str | None, method: str | None, threads: int | None) -> bool:
    """Start faulting in the mmap path's staging ring if this boot may use it; whether it started."""
    if not staging_pool.wanted(device, method):
        return False
    from tfc.runtime.boot.upload_mmap import staging_for

    try:
        cfg = staging_for(threads)
    except TfcError:  # bad options: the upload refuses them itself
        return False
    return staging_pool.prefault(cfg.slot_bytes, cfg.threads * cfg.slots_per_thread) is not None


def _boot(
    path: str | Path,
    rank: int | None,
    device: str | None,
    method: str | None,
    verify: str | None,
    options: RuntimeOptions,
    threads: int | None,
    progress: Callable[[int, int], None] | None,
    records: RecordConfig,
) -> Booted:
    """boot() itself, without the staging prefault."""
    phases = Phases()
    with phases.time("init", note="torch import, device") as ph:
        dev = pick_device(device)
        ph.note = f"torch import, device {dev}"
    with phases.time("open", note="manifest, keys, layouts, files, mmap"):
        opened = open_image(path, rank)
    off_device = OffDevice()
    try:
        with phases.time("room", note="the placement's needs against this machine's free memory"):
            check_room(opened.manifest, probe(dev))  # before anything is allocated or uploaded
            refuse_off_device(opened.manifest)
        if verify:
            with phases.time("verify", nbytes=opened.nbytes, note=f"{verify} digests"):
                verify_digests(opened, verify)
            opened.checks += (f"digests ({verify})",)
        with phases.time("alloc", note=dev) as ph:
            arena = DeviceArena(plan_arena(device_items(opened.items(), opened.manifest)), dev)
            ph.note = f"{len(arena.chunks)} chunk(s), {arena.nbytes:,} bytes on {dev}"
        total = arena.nbytes
        done = [0]
        lock = threading.Lock()

        def tick(n: int) -> None:
            with lock:  # reader threads report concurrently
                done[0] += n
                if progress:
                    progress(done[0], total)

        with phases.time("upload", nbytes=total) as ph:
            report = upload(arena, method, threads=threads, progress=tick)
            ph.note = f"{report.method}, {report.threads} threads{', ' + report.config if report.config else ''}; read overlaps upload"
            if report.steps:  # the mmap path: where its threads spent their time
                ph.note += "; summed over threads: " + ", ".join(
                    f"{k} {v:.3f} s" for k, v in report.steps.items() if k not in ("staging", "ramp")
                )
                if "ramp" in report.steps:
                    ph.note += f"; first byte copied after {report.steps['ramp']:.3f} s"
            prefaulted = staging_pool.note()
            if prefaulted:
                ph.note += "; " + prefaulted
        phases.add("read", report.read_seconds, total, "until the last byte was in host memory")
        with phases.time("tiers", note="segments placed off the device") as ph:
            off_device = place_off_device(opened, dev, records, threads)
            ph.note, ph.nbytes = off_device.note(), off_device.host_bytes
        if report.staging_seconds:
            phases.add("staging", report.staging_seconds, 0, "pinning staging slots, summed over threads")

        settings = options.graph_settings(dev)
        check_same_settings(settings)  # a no-op until torch.distributed runs several ranks
        cache = GraphCache(settings)
        with phases.time("capture") as ph:
            keys = list(opened.manifest.plan.get("graph_keys", []))
            captured: list[Any] = []  # no forward yet: nothing to capture
            ph.note = (
                f"{len(keys)} graph keys in the image's plan; the model's step graphs are captured at warm-up"
                if settings.enabled
                else "graphs off"
            )
    except BaseException:
        off_device.release()
        opened.close()
        raise
    return Booted(opened, arena, report, cache, captured, phases, off_device)
