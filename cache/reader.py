"""Open a published rank folder: validate its manifest and files, map them read-only, hand out zero-copy views."""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

from tfc.cache.errors import ImageError
from tfc.cache.files import open_regular
from tfc.cache.format import RankManifest, SegmentEntry


class RankImage:
    """A validated, memory-mapped rank folder; `segment(name)` is a read-only memoryview into the mapping."""

    def __init__(self, path: Path, manifest: RankManifest, maps: dict[str, mmap.mmap | None]) -> None:
        self.path = path
        self.manifest = manifest
        self._maps = maps
        self._views = {name: memoryview(m) if m is not None else memoryview(b"") for name, m in maps.items()}

    @property
    def segments(self) -> dict[str, SegmentEntry]:
        """Segment entries by name, in upload order."""
        return self.manifest.segment_map

    def entry(self, name: str) -> SegmentEntry:
        """The manifest entry of one segment."""
        try:
            return self.manifest.segment_map[name]
        except KeyError:
            raise ImageError(f"{self.path}: no segment named {name!r}") from None

    def segment(self, name: str) -> memoryview:
        """The bytes of one segment, zero-copy (read-only)."""
        s = self.entry(name)
        return self._views[s.file][s.offset : s.offset + s.length]

    def file_view(self, file: str) -> memoryview:
        """A whole data file, zero-copy (read-only): for bulk registration or copies."""
        return self._views[file]

    def close(self) -> None:
        """Unmap the files; views handed out must be released first."""
        for v in self._views.values():
            v.release()
        for m in self._maps.values():
            if m is not None:
                m.close()
        self._maps = {}
        self._views = {}

    def __enter__(self) -> RankImage:
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(BufferError):
            self.close()


def open_rank(path, *, verify: str | None = None) -> RankImage:
    """Validate a rank folder (manifest, file presence and sizes) and map its files read-only.

    `verify`: None for structural checks only, "sample" or "full" to also recompute digests
    (raises ImageError naming every damaged segment).
    """
    p = Path(path)
    manifest = RankManifest.load(p)
    if verify is not None:
        from tfc.cache.verify import verify_image

        report = verify_image(p, mode=verify)
        if not report.ok:
            lines = "; ".join(pr.line() for pr in report.problems[:20])
            more = f" (+{len(report.problems) - 20} more)" if len(report.problems) > 20 else ""
            raise ImageError(f"{p}: image failed {verify} verification: {lines}{more}")
    maps: dict[str, mmap.mmap | None] = {}
    try:
        for f in manifest.files:
            fp = p / f.name  # f.name matched the strict basename pattern in RankManifest.load
            fd, st = open_regular(fp, "data file", "data file is missing")
            try:
                if st.st_size != f.size:
                    what = "truncated" if st.st_size < f.size else "longer than recorded"
                    raise ImageError(
                        f"{fp}: data file is {what} ({st.st_size} bytes, manifest says {f.size})"
                    )
                maps[f.name] = mmap.mmap(fd, f.size, prot=mmap.PROT_READ) if f.size else None
            finally:
                os.close(fd)
    except BaseException:
        for m in maps.values():
            if m is not None:
                m.close()
        raise
    return RankImage(p, manifest, maps)
