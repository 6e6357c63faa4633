"""The image store on disk: find, list, hold, remove and prune world folders `<root>/<world_key[:16]>/`."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from tfc.cache.errors import ImageBusy, ImageError
from tfc.cache.format import HEX64, MANIFEST_NAME, RankManifest
from tfc.cache.image_check import RANK_DIR, check_rank, check_rank_folder
from tfc.cache.locks import HOLD_NAME, ImageHold, _open, pid_alive, remove_tree, try_exclusive, world_dir_of
from tfc.cache.publish import TEMP_PATTERN

from tfc import settings

KEY16 = re.compile(r"[0-9a-f]{16}")
TRASH_PATTERN = re.compile(r"\.trash-[0-9a-f]{16}-(\d+)-[0-9a-f]+")


def default_root() -> Path:
    """The store a command uses when it names none: the TFC_CACHE setting (default ~/.cache/tfc/images)."""
    return settings.get("TFC_CACHE")


@dataclass(frozen=True)
class ImageInfo:
    """One world folder of the store as `tfc cache ls` shows it."""

    key: str  # the folder name: world_key[:16]
    path: Path
    world_key: str | None
    family: str | None
    world: int | None
    ranks: tuple[int, ...]
    bytes: int
    created: float
    last_used: float
    held: bool
    building: int  # temp rank folders present (a writer at work, or left by a dead one)
    error: str | None = None

    @property
    def complete(self) -> bool:
        """Every rank of the world is published."""
        return self.world is not None and self.ranks == tuple(range(self.world))

    def to_dict(self) -> dict:
        """The entry as JSON."""
        return {
            "key": self.key,
            "path": str(self.path),
            "world_key": self.world_key,
            "family": self.family,
            "world": self.world,
            "ranks": list(self.ranks),
            "complete": self.complete,
            "bytes": self.bytes,
            "created": self.created,
            "last_used": self.last_used,
            "held": self.held,
            "building": self.building,
            "error": self.error,
        }


@dataclass
class PruneResult:
    """What prune removed, and what it had to leave because a process holds it."""

    removed: list[ImageInfo] = field(default_factory=list)
    held: list[ImageInfo] = field(default_factory=list)
    kept: list[ImageInfo] = field(default_factory=list)


class ImageStore:
    """The images under one root folder."""

    def __init__(self, root=None) -> None:
        self.root = Path(root) if root is not None else default_root()

    def find(self, world_key: str, rank: int | None = None) -> Path | None:
        """The published rank folder (rank given) or world folder (any rank published) of a key, else None."""
        if type(world_key) is not str or not HEX64.fullmatch(world_key):
            raise ImageError(f"world key must be 64 lowercase hex characters, got {world_key!r:.80}")
        world_dir = self.root / world_key[:16]
        ranks = [rank] if rank is not None else self._rank_numbers(world_dir)
        for r in ranks:
            folder = world_dir / f"rank{r}"
            try:
                check_rank_folder(folder)
                m = RankManifest.load(folder)
                check_rank(m, folder)
            except ImageError:
                continue
            if m.world_key == world_key and m.rank == r:
                return world_dir / f"rank{r}" if rank is not None else world_dir
        return None

    def ls(self) -> list[ImageInfo]:
        """Every world folder, most recently used first."""
        if not self.root.is_dir():
            return []
        infos = [
            self._info(Path(e.path))
            for e in os.scandir(self.root)
            if KEY16.fullmatch(e.name) and e.is_dir(follow_symlinks=False)
        ]
        return sorted(infos, key=lambda i: i.last_used, reverse=True)

    def hold(self, path) -> ImageHold:
        """Hold an image (rank or world folder) while using it: a shared lock rm and prune respect."""
        world = world_dir_of(path)
        return ImageHold(
            world,
            create=any(RANK_DIR.fullmatch(p.name) for p in world.iterdir()) if world.is_dir() else False,
        )

    def rm(self, key_prefix: str) -> Path:
        """Remove the one image whose key starts with key_prefix; ImageBusy when a process holds it."""
        prefix = key_prefix.lower()
        if not re.fullmatch(r"[0-9a-f]{4,64}", prefix):
            raise ImageError(f"image key {key_prefix!r:.80} must be 4 to 64 hex characters")
        matches = [
            i
            for i in self.ls()
            if i.key.startswith(prefix[:16]) and (i.world_key or i.key).startswith(prefix)
        ]
        if not matches:
            raise ImageError(f"no image with key {key_prefix} in {self.root}")
        if len(matches) > 1:
            raise ImageError(
                f"key {key_prefix} matches {len(matches)} images ({', '.join(i.key for i in matches)}); give more characters"
            )
        self._clean_trash()
        self._remove(matches[0].path)
        return matches[0].path

    def prune(
        self, keep: int | None = None, max_bytes: int | None = None, dry_run: bool = False
    ) -> PruneResult:
        """Remove least recently used images until at most `keep` remain and/or they total ≤ max_bytes."""
        if keep is None and max_bytes is None:
            raise ImageError("prune needs --keep N or --max-bytes B")
        if (keep is not None and keep < 0) or (max_bytes is not None and max_bytes < 0):
            raise ImageError("prune limits must not be negative")
        infos = self.ls()  # newest first
        result = PruneResult()
        total = sum(i.bytes for i in infos)
        remaining = len(infos)
        if not dry_run:
            self._clean_trash()
        for idx in range(len(infos) - 1, -1, -1):  # oldest first
            info = infos[idx]
            over_count = keep is not None and remaining > keep
            over_bytes = max_bytes is not None and total > max_bytes
            if not (over_count or over_bytes):
                result.kept.append(info)
                continue
            try:
                if info.held:
                    raise ImageBusy(f"{info.path} is held")
                if not dry_run:
                    self._remove(info.path)
            except ImageBusy:
                result.held.append(info)
                continue
            result.removed.append(info)
            total -= info.bytes
            remaining -= 1
        result.kept.reverse()
        return result

    # -- internals ------------------------------------------------------------------------------

    @staticmethod
    def _rank_numbers(world_dir: Path) -> list[int]:
        if not world_dir.is_dir():
            return []
        return sorted(int(m.group(1)) for e in os.scandir(world_dir) if (m := RANK_DIR.fullmatch(e.name)))

    def _info(self, world_dir: Path) -> ImageInfo:
        ranks, manifests, error = [], [], None
        try:
            numbers = self._rank_numbers(world_dir)
        except OSError as e:  # one unreadable image is listed as such, never the end of the listing
            numbers, error = [], f"{world_dir}: cannot list: {e.strerror}"
        for r in numbers:
            folder = world_dir / f"rank{r}"
            try:
                check_rank_folder(folder)
                m = RankManifest.load(folder)
                check_rank(m, folder)
            except ImageError as e:
                error = error or str(e)
                continue
            manifests.append(m)
            ranks.append(r)
        size, building = 0, 0
        for dirpath, dirnames, filenames in os.walk(world_dir):
            if dirpath == str(world_dir):
                building = sum(1 for d in dirnames if TEMP_PATTERN.fullmatch(d))
            for f in filenames:
                with contextlib.suppress(OSError):
                    size += os.lstat(os.path.join(dirpath, f)).st_size
        created = max(
            (_mtime(world_dir / f"rank{r}" / MANIFEST_NAME) for r in ranks), default=_mtime(world_dir)
        )
        last_used = max(created, _mtime(world_dir / HOLD_NAME))
        m = manifests[0] if manifests else None
        return ImageInfo(
            key=world_dir.name,
            path=world_dir,
            world_key=m.world_key if m else None,
            family=m.family if m else None,
            world=m.world if m else None,
            ranks=tuple(ranks),
            bytes=size,
            created=created,
            last_used=last_used,
            held=_is_held(world_dir),
            building=building,
            error=error,
        )

    def _remove(self, world_dir: Path) -> None:
        """Take the hold lock exclusively without waiting, move the folder to trash, delete it."""
        try:
            fd = _open(world_dir / HOLD_NAME, create=True)
        except OSError as error:
            raise ImageError(f"cannot lock {world_dir}: {error.strerror}") from None
        try:
            if not try_exclusive(fd):
                raise ImageBusy(f"{world_dir} is held by a running process (or being written); not removed")
            trash = self.root / f".trash-{world_dir.name}-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(world_dir, trash)  # vanishes atomically; a late holder sees it gone
            remove_tree(trash)
        finally:
            os.close(fd)

    def _clean_trash(self) -> None:
        if not self.root.is_dir():
            return
        for e in os.scandir(self.root):
            m = TRASH_PATTERN.fullmatch(e.name)
            if m and not pid_alive(int(m.group(1))):
                with contextlib.suppress(FileNotFoundError):
                    remove_tree(Path(e.path))


def _mtime(path: Path) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _is_held(world_dir: Path) -> bool:
    try:
        fd = _open(world_dir / HOLD_NAME, create=False)
    except OSError:
        return False
    try:
        return not try_exclusive(fd)
    finally:
        os.close(fd)  # closing drops the probe lock at once


def age(seconds_since: float, now: float | None = None) -> str:
    """A short age: 42s, 5m, 3h, 2d."""
    s = max(0.0, (now or time.time()) - seconds_since)
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= n:
            return f"{int(s // n)}{unit}"
    return f"{int(s)}s"
