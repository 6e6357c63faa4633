"""Verify an image (world or rank folder): manifests, files and recomputed chunk digests, in parallel."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tfc.cache import digest as _digest
from tfc.cache.errors import ImageError
from tfc.cache.files import open_read, why
from tfc.cache.format import RankManifest, SegmentEntry
from tfc.cache.image_check import check_rank, check_rank_folder, rank_folders

SAMPLE_STRIDE = 16  # --sample: first and last chunk of every segment plus every 16th chunk
TASK_CHUNKS = _digest.BLOCK // _digest.CHUNK

MODES = ("full", "sample")


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an image: kind is manifest, missing_rank, mismatch, missing_file, file_size,
    missing, truncated, damaged or unreadable."""

    kind: str
    rank: int | None
    where: str
    file: str | None = None
    segment: str | None = None
    detail: str = ""

    def line(self) -> str:
        """One human-readable line."""
        parts = [self.kind.upper().replace("_", " ")]
        if self.rank is not None:
            parts.append(f"rank{self.rank}")
        if self.file:
            parts.append(self.file)
        if self.segment:
            parts.append(f"segment {self.segment}")
        head = " ".join(parts)
        return f"{head}: {self.detail}" if self.detail else head

    def to_dict(self) -> dict:
        """The problem as JSON."""
        return {
            "kind": self.kind,
            "rank": self.rank,
            "where": self.where,
            "file": self.file,
            "segment": self.segment,
            "detail": self.detail,
        }


@dataclass
class VerifyReport:
    """What verify_image checked and everything it found wrong."""

    path: str
    mode: str
    ranks: list[int] = field(default_factory=list)
    segments: int = 0
    bytes_total: int = 0
    bytes_checked: int = 0
    seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when nothing is wrong."""
        return not self.problems

    def to_dict(self) -> dict:
        """The report as JSON (stable keys for scripts)."""
        return {
            "path": self.path,
            "mode": self.mode,
            "ok": self.ok,
            "ranks": self.ranks,
            "segments": self.segments,
            "bytes_total": self.bytes_total,
            "bytes_checked": self.bytes_checked,
            "seconds": round(self.seconds, 4),
            "problems": [p.to_dict() for p in self.problems],
        }


def sample_chunks(n: int) -> list[int]:
    """Chunk indices `--sample` checks in a segment of n chunks: first, last and every 16th."""
    return sorted({0, n - 1, *range(0, n, SAMPLE_STRIDE)})


@dataclass
class _Task:
    rank: int
    fd: int
    path: str
    seg: SegmentEntry
    first: int  # chunk index
    last: int  # exclusive

    @property
    def start(self) -> int:
        return self.first * _digest.CHUNK

    @property
    def nbytes(self) -> int:
        return min(self.seg.length, self.last * _digest.CHUNK) - self.start


def _expected(seg: SegmentEntry, i: int) -> str:
    return seg.chunks[i] if seg.chunks else seg.digest


def verify_image(
    path,
    mode: str = "full",
    jobs: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> VerifyReport:
    """Check manifests, files and digests of a world or rank folder; never raises for damage, reports it.

    `progress(done_bytes, total_bytes)` is called from worker threads as chunks are hashed.
    """
    if mode not in MODES:
        raise ImageError(f"verify mode must be one of {', '.join(MODES)}, got {mode!r}")
    t0 = time.perf_counter()
    p = Path(path)
    is_world, folders = rank_folders(p)
    report = VerifyReport(str(p), mode)
    manifests: dict[int, RankManifest] = {}
    for r, folder in folders.items():
        try:
            check_rank_folder(folder)
            m = RankManifest.load(folder)
            check_rank(m, folder)  # what load refuses, verify reports
        except ImageError as error:
            report.problems.append(Problem("manifest", r, str(folder), detail=str(error)))
            continue
        manifests[m.rank] = m
    if is_world and manifests:
        first = manifests[min(manifests)]
        for r, m in manifests.items():
            if (m.world_key, m.world) != (first.world_key, first.world):
                report.problems.append(
                    Problem(
                        "mismatch", r, str(folders[r]), detail=f"world key/world differ from rank{first.rank}"
                    )
                )
        for r in range(first.world):
            if r not in folders:
                report.problems.append(
                    Problem("missing_rank", r, str(p / f"rank{r}"), detail="rank folder is missing")
                )
        for r in folders:
            if r is not None and r >= first.world:
                report.problems.append(
                    Problem("mismatch", r, str(folders[r]), detail=f"rank outside world {first.world}")
                )
    report.ranks = sorted(manifests)

    fds: list[int] = []
    tasks: list[_Task] = []
    try:
        for r, m in sorted(manifests.items()):
            folder = folders[r] if r in folders else folders[None]
            tasks += _file_checks(r, folder, m, mode, report, fds)
        report.segments = sum(len(m.segments) for m in manifests.values())
        report.bytes_total = sum(m.total_bytes for m in manifests.values())
        total = sum(t.nbytes for t in tasks)
        report.problems += _run(tasks, total, jobs, progress)
        report.bytes_checked = total
    finally:
        for fd in fds:
            os.close(fd)
    report.seconds = time.perf_counter() - t0
    return report


def _file_checks(
    r: int, folder: Path, m: RankManifest, mode: str, report: VerifyReport, fds: list[int]
) -> list[_Task]:
    tasks = []
    by_file: dict[str, list[SegmentEntry]] = {}
    for s in m.segments:
        by_file.setdefault(s.file, []).append(s)
    for f in m.files:
        fp = folder / f.name  # a strict basename from the validated manifest
        segs = by_file.get(f.name, [])
        try:
            fd, st = open_read(fp)
        except OSError as error:
            if isinstance(error, FileNotFoundError):
                kind, what = "missing_file", "data file is missing"
            else:
                kind, what = "unreadable", f"data file is {why(error)}"
            report.problems.append(Problem(kind, r, str(fp), f.name, detail=what))
            report.problems += [Problem("missing", r, str(fp), f.name, s.name, f"its {what}") for s in segs]
            continue
        fds.append(fd)
        size = st.st_size
        if size != f.size:
            what = "truncated" if size < f.size else "longer than recorded"
            report.problems.append(
                Problem(
                    "file_size", r, str(fp), f.name, detail=f"{what}: {size} bytes, manifest says {f.size}"
                )
            )
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        for s in segs:
            if s.offset + s.length > size:
                report.problems.append(
                    Problem(
                        "truncated",
                        r,
                        str(fp),
                        f.name,
                        s.name,
                        f"bytes [{s.offset}, {s.offset + s.length}) end past the file's {size} bytes",
                    )
                )
                continue
            n = _digest.chunk_count(s.length)
            picked = range(n) if mode == "full" else sample_chunks(n)
            tasks += _runs(r, fd, str(fp), s, picked)
    return tasks


def _runs(r: int, fd: int, path: str, seg: SegmentEntry, picked) -> list[_Task]:
    """Group picked chunk indices into contiguous runs of at most TASK_CHUNKS chunks."""
    out: list[_Task] = []
    for i in picked:
        last = out[-1] if out else None
        if last is not None and last.last == i and last.last - last.first < TASK_CHUNKS:
            last.last = i + 1
        else:
            out.append(_Task(r, fd, path, seg, i, i + 1))
    return out


def _run(tasks: list[_Task], total: int, jobs: int | None, progress) -> list[Problem]:
    local = threading.local()
    lock = threading.Lock()
    done = [0]

    def check(t: _Task) -> tuple[_Task, list[int], str | None]:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(_digest.PIECE)
        try:
            raw = _digest.read_chunk_digests(t.fd, t.seg.offset + t.start, t.nbytes, buf)
        except EOFError as error:
            return t, [], f"truncated while reading: {error}"
        except OSError as error:
            return t, [], f"read error: {error.strerror or error}"
        bad = [t.first + k for k, d in enumerate(raw) if d.hex() != _expected(t.seg, t.first + k)]
        if progress is not None:
            with lock:
                done[0] += t.nbytes
                progress(done[0], total)
        return t, bad, None

    workers = max(1, jobs or os.cpu_count() or 1)
    bad_chunks: dict[tuple[int, str], list[int]] = {}
    failures: dict[tuple[int, str], str] = {}
    segs: dict[tuple[int, str], _Task] = {}
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tfc-verify") as pool:
        for t, bad, err in pool.map(check, tasks):
            k = (t.rank, t.seg.name)
            segs.setdefault(k, t)
            if err:
                failures.setdefault(k, err)
            if bad:
                bad_chunks.setdefault(k, []).extend(bad)
    problems = []
    for k, t in segs.items():
        if k in failures:
            problems.append(Problem("unreadable", t.rank, t.path, t.seg.file, t.seg.name, failures[k]))
        elif k in bad_chunks:
            bad = sorted(bad_chunks[k])
            first = bad[0] * _digest.CHUNK
            detail = (
                f"digest mismatch in {len(bad)} chunk(s), first at byte {first} of the segment "
                f"(file offset {t.seg.offset + first})"
            )
            problems.append(Problem("damaged", t.rank, t.path, t.seg.file, t.seg.name, detail))
    return problems
