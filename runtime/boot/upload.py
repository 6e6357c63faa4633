"""Fill a DeviceArena from the rank's files: `plan_upload` chooses the path and its staging, `run_upload` runs it.

* `auto` (the default): `mmap` when the page cache holds the image (a `mincore` probe), else `ring`.
* `mmap` (runtime/boot/upload_mmap.py): threads copy the read-only mapping into a pinned staging ring
  while the host-to-device copies of earlier slots run.
* `ring`, `register` (runtime/boot/upload_paths.py): reads into pinned slots, or the mapping page-locked
  window by window.
* `host`: the arena lives in host memory (no CUDA): threads `preadv` straight into it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfc.runtime.boot import upload_files as uf
from tfc.runtime.boot import upload_paths as paths
from tfc.runtime.boot.arena import DeviceArena
from tfc.runtime.boot.pages import resident_fraction
from tfc.runtime.boot.upload_files import Progress, UploadError

if TYPE_CHECKING:
    from tfc.runtime.boot.upload_mmap import MmapStaging

METHODS = ("auto", "ring", "mmap", "register", "host")
THREADS = 8  # readers or registration threads when not asked for (mmap: its own default)
# Ring staging, chosen by the page-cache probe (benchmarks/summaries/boot.md): many small slots when the image
# is cached, a few large reads in flight when it comes from disk.
WARM_RING = (4 << 20, 4)
COLD_RING = (64 << 20, 2)
WARM_FRACTION = 0.9
WINDOW_BYTES = 256 << 20  # register: bytes page-locked at a time
HOST_PIECE = 16 << 20  # host: bytes per read


@dataclass(frozen=True)
class UploadReport:
    """What an upload moved and how long it took (read overlaps the copy)."""

    method: str
    device: str
    bytes: int
    seconds: float  # until every byte is resident in the arena
    read_seconds: float  # until the last byte was in host memory (read or registered)
    threads: int
    config: str = ""  # the staging chosen, and why
    staging_seconds: float = 0.0  # allocating staging, summed over the threads (overlaps the copies)
    steps: dict[str, float] = field(default_factory=dict)  # mmap: seconds per step, summed over threads

    @property
    def gbps(self) -> float:
        """Bytes per second over the whole upload, in GB/s (1e9)."""
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class UploadPlan:
    """One upload's path and staging as `plan_upload` chooses them (a benchmark may build its own)."""

    method: str  # mmap, ring, register or host
    threads: int
    slot_bytes: int = HOST_PIECE  # ring: each staging slot; host: each read
    slots_per_thread: int = 2  # ring
    mmap: MmapStaging | None = None  # mmap: its staging ring
    notes: tuple[str, ...] = ()  # what was chosen, and why

    @property
    def config(self) -> str:
        """The notes as the report's one line."""
        return "; ".join(self.notes)


def plan_upload(arena: DeviceArena, method: str | None = None, threads: int | None = None) -> UploadPlan:
    """The path and staging for `arena` (host for a CPU arena, auto by default): `auto` takes `mmap` when the page
    cache holds the image and `ring` otherwise; the ring picks its slots by the same probe."""
    method = method or "auto"
    if method not in METHODS:
        raise UploadError(f"upload method {method!r} is not one of {METHODS}")
    if arena.device.type == "cpu":
        if method not in ("auto", "host"):
            raise UploadError(
                f"upload method {method!r} needs a CUDA device; a CPU arena takes plain host copies"
            )
        method = "host"
    if method == "host" and arena.device.type != "cpu":
        raise UploadError("upload method 'host' needs a CPU arena")
    if threads is not None and threads < 1:
        raise UploadError(f"upload needs at least one thread, not {threads}")
    notes: list[str] = []
    resident = 0.0
    if method in ("auto", "ring"):
        resident = resident_fraction(sorted({c.path for c in arena.plan.chunks}))
    if method == "auto":
        method = "mmap" if resident >= WARM_FRACTION else "ring"
        notes.append(f"auto: {resident:.0%} of the image in page cache")
    if method == "mmap":
        from tfc.runtime.boot.upload_mmap import copier_note, staging_for

        cfg = staging_for(threads)
        notes[:0] = [cfg.describe(), *filter(None, [copier_note(cfg)])]
        return UploadPlan("mmap", cfg.threads, mmap=cfg, notes=tuple(notes))
    if method == "ring":
        slot_bytes, per = WARM_RING if resident >= WARM_FRACTION else COLD_RING
        notes.insert(0, f"{slot_bytes >> 20} MiB x {per} slots")
        if len(notes) == 1:
            notes.append(f"{resident:.0%} of the image in page cache")
        return UploadPlan("ring", threads or THREADS, slot_bytes, per, notes=tuple(notes))
    return UploadPlan(method, threads or THREADS)


def run_upload(
    arena: DeviceArena, plan: UploadPlan, progress: Progress | None = None, started: float | None = None
) -> UploadReport:
    """Fill `arena` as `plan` says; times count from `started` (perf_counter; default: now)."""
    tick = progress or (lambda n: None)
    t0 = time.perf_counter() if started is None else started
    staging, steps = 0.0, {}
    with uf.RankFiles(arena) as files:
        if plan.method == "host":
            read_done = paths.upload_host(arena, files, plan.threads, plan.slot_bytes, tick)
        elif plan.method == "mmap":
            times = plan.mmap.upload(arena, files, tick)
            read_done, staging, steps = times.read_done, times.staging, times.steps()
            if times.first_copy:  # wall seconds before the first byte left the mapping (not summed)
                steps["ramp"] = round(times.first_copy - t0, 4)
        elif plan.method == "ring":
            read_done = paths.upload_ring(
                arena, files, plan.threads, plan.slot_bytes, plan.slots_per_thread, tick
            )
        else:
            read_done = paths.upload_register(arena, files, plan.threads, WINDOW_BYTES, tick)
    t1 = time.perf_counter()
    return UploadReport(
        plan.method, str(arena.device), arena.nbytes, t1 - t0, read_done - t0, plan.threads, plan.config,
        staging, steps,
    )  # fmt: skip


def upload(
    arena: DeviceArena,
    method: str | None = None,
    threads: int | None = None,
    progress: Progress | None = None,
) -> UploadReport:
    """Fill `arena` from its plan's files with `method` (see plan_upload); `progress(bytes)` as bytes move."""
    t0 = time.perf_counter()
    return run_upload(arena, plan_upload(arena, method, threads), progress, t0)


__all__ = [
    "COLD_RING",
    "METHODS",
    "THREADS",
    "WARM_FRACTION",
    "WARM_RING",
    "WINDOW_BYTES",
    "UploadError",
    "UploadPlan",
    "UploadReport",
    "plan_upload",
    "run_upload",
    "upload",
]
