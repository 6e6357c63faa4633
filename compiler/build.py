"""Fill rank images from a pack: each source byte read once, in large positional reads, for every rank."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from tfc.compiler.convert import convert_elements
from tfc.compiler.errors import BuildError
from tfc.compiler.segments import HELD_ITEMSIZE, STORED_NUMPY, Copy
from tfc.packs.files import open_fd

READ_MAX = 64 << 20  # one positional read covers at most this many bytes
READ_GAP = 1 << 20  # sources closer than this are read through rather than read twice


@dataclass(frozen=True)
class Op:
    """One copy bound to its destination: which writer, which slot."""

    copy: Copy
    sink: int  # index into the sinks list (a rank writer and slot)


def split_copy(copy: Copy, limit: int = READ_MAX) -> list[Copy]:
    """Cut a copy into pieces whose source span fits one read (whole rows, whole elements)."""
    if copy.span <= limit:
        return [copy]
    if copy.rows > 1:
        per = max(1, limit // max(copy.stride, 1))
        pieces, row = [], 0
        out_row = copy.out_bytes // copy.rows
        while row < copy.rows:
            n = min(per, copy.rows - row)
            pieces.append(
                replace(copy, src=copy.src + row * copy.stride, rows=n, dst=copy.dst + row * out_row)
            )
            row += n
        return pieces
    unit = 8 if copy.convert is None else np.dtype(STORED_NUMPY[copy.convert[0]]).itemsize
    ratio = 1.0 if copy.convert is None else HELD_ITEMSIZE[copy.convert[1]] / unit
    step = limit - limit % unit
    pieces, done = [], 0
    while done < copy.run:
        n = min(step, copy.run - done)
        pieces.append(replace(copy, src=copy.src + done, run=n, dst=copy.dst + int(done * ratio)))
        done += n
    return pieces


def coalesce(ops: list[Op]) -> list[list[Op]]:
    """Group ops, sorted by file and source offset, into covering reads of at most READ_MAX bytes."""
    ops = sorted(ops, key=lambda op: (str(op.copy.file), op.copy.src))
    reads: list[list[Op]] = []
    start = end = 0
    current_file = None
    for op in ops:
        c = op.copy
        c_end = c.src + c.span
        if (
            reads
            and c.file == current_file
            and c.src <= end + READ_GAP
            and max(end, c_end) - start <= READ_MAX
        ):
            reads[-1].append(op)
            end = max(end, c_end)
        else:
            reads.append([op])
            current_file, start, end = c.file, c.src, c_end
    return reads


def extract(buf: np.ndarray, base: int, copy: Copy) -> np.ndarray:
    """The bytes a copy moves, gathered from a read buffer that starts at file offset `base`."""
    at = copy.src - base
    if copy.rows == 1:
        raw = buf[at : at + copy.run]
    else:
        raw = np.lib.stride_tricks.as_strided(
            buf[at:], shape=(copy.rows, copy.run), strides=(copy.stride, 1), writeable=False
        )
    if copy.convert is None:
        return np.ascontiguousarray(raw).reshape(-1)
    return convert_elements(np.ascontiguousarray(raw).reshape(-1), *copy.convert)


class Reader:
    """Positional reads from pack files, one descriptor a file, safe across threads."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()

    def fd(self, path: Path) -> int:
        with self._lock:
            if path not in self._fds:
                self._fds[path] = open_fd(path, BuildError)
            return self._fds[path]

    def read(self, path: Path, offset: int, length: int) -> np.ndarray:
        """Exactly `length` bytes at `offset`, or a BuildError naming the file."""
        buf = np.empty(length, dtype=np.uint8)
        view, done, fd = memoryview(buf), 0, self.fd(path)
        while done < length:
            got = os.preadv(fd, [view[done:]], offset + done)
            if got <= 0:
                raise BuildError(
                    f"{path}: short read at byte {offset + done} (the pack changed during prepare?)"
                )
            done += got
        return buf

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


def run_reads(
    ops: Iterable[Op],
    write: Callable[[int, int, np.ndarray], None],
    jobs: int,
    on_bytes: Callable[[int, int], None] | None = None,
) -> None:
    """Execute ops: covering reads in parallel, each op's bytes handed to `write(sink, dst, data)`."""
    pieces = [Op(piece, op.sink) for op in ops for piece in split_copy(op.copy)]
    reads = coalesce(pieces)
    reader = Reader()

    def one(group: list[Op]) -> None:
        start = group[0].copy.src
        end = max(op.copy.src + op.copy.span for op in group)
        buf = reader.read(group[0].copy.file, start, end - start)
        for op in group:
            data = extract(buf, start, op.copy)
            write(op.sink, op.copy.dst, data)
            if on_bytes:
                on_bytes(op.sink, data.nbytes)

    try:
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for future in [pool.submit(one, group) for group in reads]:
                future.result()
    finally:
        reader.close()
