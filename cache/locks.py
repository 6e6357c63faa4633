"""flock-based locks of an image folder: `.lock` serialises publishers, `.hold` marks images in use."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import shutil
import stat
from pathlib import Path

from tfc.cache.errors import ImageError
from tfc.cache.files import not_regular, why

LOCK_NAME = ".lock"  # exclusive while a writer cleans temps or publishes a rank
BUILD_NAME = ".build"  # exclusive while one process builds ranks, so concurrent builders of a key wait
HOLD_NAME = ".hold"  # shared while a process uses or writes the image; exclusive to remove it

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def _open(path: Path, create: bool) -> int:
    # O_NONBLOCK: a named pipe in a lock's place opens at once (and is refused) instead of waiting for a writer
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        if not create:
            raise
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC, 0o644)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(path, mode)
    os.set_blocking(fd, True)
    return fd


@contextlib.contextmanager
def exclusive(world_dir: Path):
    """Hold `<world_dir>/.lock` exclusively (blocking) for the body."""
    try:
        fd = _open(world_dir / LOCK_NAME, create=True)
    except OSError as error:
        raise ImageError(f"{world_dir / LOCK_NAME}: cannot lock the image folder: {why(error)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextlib.contextmanager
def building(world_dir: Path):
    """Hold `<world_dir>/.build` exclusively (blocking): one builder of a key at a time; a killed one lets go."""
    try:
        world_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ImageError(f"cannot create image folder {world_dir}: {error.strerror}") from None
    try:
        fd = _open(world_dir / BUILD_NAME, create=True)
    except OSError as error:
        raise ImageError(f"{world_dir / BUILD_NAME}: cannot lock the image folder: {why(error)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def try_exclusive(fd: int) -> bool:
    """Take an exclusive flock without waiting; False when someone holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class ImageHold:
    """A shared lock on an image's `.hold` file: while it exists, rm and prune leave the image alone."""

    def __init__(self, world_dir: Path, create: bool = False) -> None:
        self.world_dir = Path(world_dir)
        self._fd: int | None = None
        hold = self.world_dir / HOLD_NAME
        try:
            fd = _open(hold, create=create)
        except FileNotFoundError:
            raise ImageError(f"{self.world_dir}: not an image folder (no {HOLD_NAME})") from None
        except PermissionError:
            # a read-only store: nobody can remove the image, so there is nothing to guard against
            return
        except OSError as error:
            raise ImageError(f"{hold}: cannot hold the image: {why(error)}") from None
        fcntl.flock(fd, fcntl.LOCK_SH)
        try:
            same = os.stat(hold, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            raise ImageError(f"{self.world_dir}: the image was removed while being opened")
        self._fd = fd
        with contextlib.suppress(OSError):
            os.utime(hold)  # last-used time for `tfc cache ls` and prune order

    @property
    def held(self) -> bool:
        """True until released."""
        return self._fd is not None

    def release(self) -> None:
        """Drop the hold (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ImageHold:
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __del__(self) -> None:
        self.release()


def world_dir_of(path: str | os.PathLike) -> Path:
    """The world folder of a rank folder or world folder path."""
    p = Path(path)
    return p.parent if (p / "manifest.json").exists() or re.fullmatch(r"rank\d+", p.name) else p


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_tree(path: Path) -> None:
    """Remove a folder we created (never follows symlinks out of it)."""
    st = os.lstat(path)
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)
