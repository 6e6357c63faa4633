"""What a path that is not a regular file is, in words: one table for the pack and image readers alike."""

from __future__ import annotations

import stat

KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISLNK, "a symbolic link"),
)


def file_kind(mode: int) -> str:
    """What a non-regular file is ("a named pipe", "a character device", ...), from its st_mode."""
    return next((name for test, name in KINDS if test(mode)), "not a regular file")
