"""Open a prepared rank image for the runtime: find the rank folder, map it, refuse what cannot run.

`tfc.cache.reader.open_rank` validates the manifest as data (format, bounds, digests of the
manifest itself) and maps the files; `tfc.cache.image_check` refuses what verify refuses too (rank
folders, keys, the layout contract); this module adds what only the runtime knows: the rank it
wants, the layout ids it can execute and the segments its forward expects.
Every refusal is one line that ends by saying to re-run `tfc prepare`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfc.cache.contract import LAYOUTS, SegmentSpec
from tfc.cache.errors import ImageError
from tfc.cache.format import RankManifest
from tfc.cache.image_check import check_rank, check_rank_folder, rank_folders
from tfc.cache.reader import RankImage, open_rank
from tfc.runtime.boot.arena import UploadItem

HINT = "re-run `tfc prepare` to rebuild it"

KNOWN_LAYOUTS = LAYOUTS  # the layout ids this runtime executes: every one the image contract defines


class ImageRefused(ImageError):
    """An image this runtime will not run: damaged, stale, for another rank, or of unknown layout."""


# family -> function giving the segments its forward expects from the manifest (plan, config in meta).
Expectation = Callable[[RankManifest], Mapping[str, SegmentSpec]]
EXPECTATIONS: dict[str, Expectation] = {}


def register_expectation(family: str, fn: Expectation) -> None:
    """Let a model family's forward declare the segments an image of that family must hold."""
    EXPECTATIONS[family] = fn


@dataclass
class OpenedImage:
    """A rank image the runtime accepted: its manifest, its mapping and what was checked."""

    path: Path
    image: RankImage
    signature: str
    checks: tuple[str, ...]
    hold: Any = None

    @property
    def manifest(self) -> RankManifest:
        """The rank's validated manifest."""
        return self.image.manifest

    @property
    def nbytes(self) -> int:
        """Bytes of segment payload."""
        return sum(s.length for s in self.manifest.segments)

    def items(self) -> list[UploadItem]:
        """Every segment as an upload item, in upload (manifest) order."""
        return [UploadItem(s.name, self.path / s.file, s.offset, s.length) for s in self.manifest.segments]

    def close(self) -> None:
        """Unmap the files and release the hold on the image."""
        with contextlib.suppress(BufferError):
            self.image.close()
        if self.hold is not None:
            with contextlib.suppress(Exception):
                self.hold.release()
            self.hold = None

    def __enter__(self) -> OpenedImage:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def resolve_rank_dir(path: str | Path, rank: int | None = None) -> Path:
    """The rank folder for `path`: a rank folder itself, or a world folder holding rank{r}/."""
    p = Path(path)
    try:
        is_world, folders = rank_folders(p)  # the folders verify finds, found the same way
    except ImageError as error:
        raise ImageRefused(str(error)) from None
    if not is_world:
        ((named, folder),) = folders.items()
        if rank is not None and named is not None and named != rank:
            raise ImageRefused(f"{p} is the folder of rank {named}, not rank {rank}")
    else:
        want = min(folders) if rank is None else rank
        if want not in folders:
            raise ImageRefused(
                f"{p} has no rank {want} (it has ranks {sorted(folders)}); {HINT} for that rank"
            )
        folder = folders[want]
    try:
        check_rank_folder(folder)
    except ImageError as error:
        raise ImageRefused(_with_hint(str(error))) from None
    return folder


def structural_signature(manifest: RankManifest) -> str:
    """SHA-256 over (name, dtype, shape, layout) of every segment, in upload order."""
    rows = [[s.name, s.dtype, list(s.shape), s.layout] for s in manifest.segments]
    return hashlib.sha256(json.dumps(rows, separators=(",", ":")).encode()).hexdigest()


def open_image(
    path: str | Path,
    rank: int | None = None,
    *,
    verify: str | None = None,
    expect: Mapping[str, SegmentSpec] | None = None,
    layouts: frozenset[str] = KNOWN_LAYOUTS,
    hold: bool = True,
) -> OpenedImage:
    """Open and check a rank image; `verify` ("full" or "sample") also recomputes payload digests."""
    rank_dir = resolve_rank_dir(path, rank)
    try:
        image = open_rank(rank_dir, verify=verify)
    except ImageRefused:
        raise
    except ImageError as error:
        raise ImageRefused(_with_hint(str(error))) from None
    try:
        checks = check_manifest(image.manifest, rank_dir, rank, expect, layouts)
        if verify:
            checks += (f"digests ({verify})",)
        held = _hold(rank_dir) if hold else None
    except BaseException:
        with contextlib.suppress(BufferError):
            image.close()
        raise
    return OpenedImage(rank_dir, image, structural_signature(image.manifest), checks, held)


def verify_digests(opened: OpenedImage, mode: str = "full", jobs: int | None = None) -> None:
    """Recompute payload digests in parallel; refuse the image naming its damaged segments."""
    from tfc.cache.verify import verify_image

    report = verify_image(opened.path, mode=mode, jobs=jobs)
    if not report.ok:
        lines = "; ".join(pr.line() for pr in report.problems[:5])
        more = f" (+{len(report.problems) - 5} more)" if len(report.problems) > 5 else ""
        raise ImageRefused(f"{opened.path}: image failed {mode} verification: {lines}{more}; {HINT}")


def check_manifest(
    m: RankManifest,
    rank_dir: Path,
    rank: int | None = None,
    expect: Mapping[str, SegmentSpec] | None = None,
    layouts: frozenset[str] = KNOWN_LAYOUTS,
) -> tuple[str, ...]:
    """Runtime checks of an accepted manifest; returns the names of the checks made."""
    where = str(rank_dir)
    if rank is not None and m.rank != rank:
        _refuse(where, f"the manifest is for rank {m.rank} of {m.world}, not rank {rank}")
    try:
        check_rank(m, rank_dir)  # folder, keys, layout contract: what verify checks too
    except ImageError as error:
        raise ImageRefused(_with_hint(str(error))) from None
    checks = ["manifest", "files", "rank", "keys"]
    unknown = sorted({s.layout for s in m.segments} - layouts)
    if unknown:
        first = next(s for s in m.segments if s.layout == unknown[0])
        _refuse(where, f"segment {first.name} has layout {unknown[0]!r}, which this runtime does not know")
    checks.append("layouts")
    if expect is None and m.family in EXPECTATIONS:
        expect = EXPECTATIONS[m.family](m)
    if expect is not None:
        _check_expected(where, m, expect)
        checks.append("structure")
    return tuple(checks)


def _check_expected(where: str, m: RankManifest, expect: Mapping[str, SegmentSpec]) -> None:
    have = m.segment_map
    missing = [n for n in expect if n not in have]
    extra = [n for n in have if n not in expect]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''}")
        if extra:
            parts.append(f"unexpected {', '.join(extra[:3])}{' …' if len(extra) > 3 else ''}")
        _refuse(where, f"the segments differ from what the runtime expects ({'; '.join(parts)})")
    for name, spec in expect.items():
        s = have[name]
        got = SegmentSpec(s.dtype, tuple(s.shape), s.layout)
        if got != SegmentSpec(spec.dtype, tuple(spec.shape), spec.layout):
            _refuse(
                where,
                f"segment {name} is {s.dtype}{list(s.shape)} {s.layout}, the runtime expects "
                f"{spec.dtype}{list(spec.shape)} {spec.layout}",
            )


def _refuse(where: str, why: str) -> None:
    raise ImageRefused(f"{where}: {why}; {HINT}")


def _with_hint(message: str) -> str:
    return message if "tfc prepare" in message else f"{message}; {HINT}"


def _hold(rank_dir: Path) -> Any:
    """Hold the image so `tfc cache rm/prune` leave it alone while it is loaded (best effort)."""
    try:
        from tfc.cache.store import ImageStore

        return ImageStore(rank_dir.parent.parent).hold(rank_dir)
    except (ImportError, ImageError, OSError):
        return None  # not inside a store (no .hold file) or a read-only store: nothing to guard
