"""Atomic publish of a built rank folder: the manifest last, then a rename into place under the lock."""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from tfc.cache.errors import ImageError
from tfc.cache.format import MANIFEST_NAME, RankManifest
from tfc.cache.image_check import check_rank_folder
from tfc.cache.locks import exclusive, pid_alive, remove_tree

TEMP_PATTERN = re.compile(r"\.tmp-rank(\d+)-(\d+)-[0-9a-f]+")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def write_manifest(folder: Path, manifest: RankManifest) -> None:
    """Write and fsync `folder`'s manifest.json, then the folder itself."""
    fd = os.open(folder / MANIFEST_NAME, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
    try:
        view = memoryview(manifest.to_json().encode())
        while len(view):
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    fsync_dir(folder)


def rename_into_place(temp: Path, dest: Path, world_key: str, root: Path) -> None:
    """Rename a finished temp folder to `dest`, or drop it where `dest` already holds the same image."""
    try:
        with exclusive(dest.parent):
            if dest.exists() or dest.is_symlink():
                try:
                    check_rank_folder(dest)  # a linked rank folder is never taken for the published one
                    other = RankManifest.load(dest)
                except ImageError as error:
                    raise ImageError(
                        f"{dest} already exists but is unreadable ({error}); remove it with `tfc cache rm`"
                    ) from None
                if other.world_key != world_key:
                    raise ImageError(
                        f"{dest} holds another image (world key {other.world_key[:16]}…); remove it with `tfc cache rm`"
                    )
                remove_tree(temp)
            else:
                os.rename(temp, dest)
                fsync_dir(dest.parent)
                fsync_dir(root)  # the world folder's own entry may be new too
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            remove_tree(temp)
        raise


def fsync_dir(path: Path) -> None:
    """Make a folder's entries durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def remove_stale_temps(world_dir: Path) -> list[Path]:
    """Remove temp rank folders whose writer process is gone (call under the exclusive lock)."""
    removed = []
    for entry in os.scandir(world_dir):
        m = TEMP_PATTERN.fullmatch(entry.name)
        if m and not pid_alive(int(m.group(2))):
            with contextlib.suppress(FileNotFoundError):
                remove_tree(Path(entry.path))
            removed.append(Path(entry.path))
    return removed
