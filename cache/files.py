"""Open an image's files for reading: regular files only, never through a link, never waiting on a pipe."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from tfc.cache.errors import ImageError

from tfc.files import file_kind

# O_NONBLOCK: opening a named pipe returns at once instead of waiting for a writer (then fstat refuses it).
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def not_regular(path: Path, mode: int) -> OSError:
    """The OSError for a path that exists but is not a regular file (strerror says what it is)."""
    return OSError(errno.EINVAL, f"{file_kind(mode)}, not a regular file", str(path))


def open_read(path: Path) -> tuple[int, os.stat_result]:
    """(fd, stat) of a regular file opened read-only; OSError for anything else, before it is read.

    A final symbolic link fails with ELOOP; a pipe, device or socket with `not_regular`'s error: the
    lstat refuses it before any open (opening a device can act), the fstat after it closes the race.
    """
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, "a symlink (refused)", str(path))
        raise not_regular(path, st.st_mode)
    fd = os.open(path, READ_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise not_regular(path, st.st_mode)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def why(error: OSError) -> str:
    """A short reason for an OSError of open_read ("a named pipe, not a regular file", "a symbolic link ...")."""
    if error.errno == errno.ELOOP:
        return "a symlink (refused)"
    return error.strerror or str(error)


def open_regular(path: Path, what: str, missing: str) -> tuple[int, os.stat_result]:
    """(fd, stat) of a regular file opened read-only without following a link; ImageError otherwise."""
    try:
        return open_read(path)
    except FileNotFoundError:
        raise ImageError(f"{path}: {missing}") from None
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EINVAL):
            raise ImageError(f"{path}: {what} is {why(error)}") from None
        raise ImageError(f"{path}: cannot open {what}: {why(error)}") from None
