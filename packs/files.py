"""Open a pack's files for reading: regular files only, so a named pipe or a device never blocks a read."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from tfc.packs.errors import PackError

from tfc.files import file_kind

# O_NONBLOCK: a named pipe opens at once instead of waiting for a writer (fstat then refuses it).
# Links are followed: packs are often snapshots whose files link into a download cache.
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
kind = file_kind  # what a file that is not regular is, in words


def open_fd(path: Path | str, error: type[Exception] = PackError) -> int:
    """A read-only descriptor of a regular file, or `error` naming the file and what it is instead.

    The stat refuses a pipe, device or socket before any open (opening a device can act); the fstat
    after the open closes the race of a file swapped in between.
    """
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: {kind(st.st_mode)}, not a regular file")
        fd = os.open(path, _FLAGS)
    except OSError as e:
        raise error(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: {kind(st.st_mode)}, not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path | str, limit: int, error: type[Exception] = PackError) -> bytes:
    """A regular file's whole content, refused over `limit` bytes (a file growing meanwhile included)."""
    fd = open_fd(path, error)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise error(f"{path}: {size:,} bytes, over the {limit:,}-byte limit")
        chunks, total = [], 0
        while True:
            try:
                b = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as e:
                raise error(f"{path}: cannot read: {e.strerror or e}") from None
            if not b:
                break
            chunks.append(b)
            total += len(b)
            if total > limit:
                raise error(f"{path}: over the {limit:,}-byte limit")
    finally:
        os.close(fd)
    return b"".join(chunks)
