"""ImageWriter: reserve aligned segments, write them from many threads, publish a rank folder atomically."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from tfc.cache import digest as _digest
from tfc.cache.contract import DTYPES, ID, TIER_DEVICE, TIERS, SegmentRecord, SegmentSpec
from tfc.cache.errors import ImageError
from tfc.cache.format import (
    FILE_NAME,
    FORMAT_VERSION,
    HEX64,
    MAX_NDIM,
    SEGMENT_NAME,
    SegmentEntry,
    align_up,
    root_digest_of,
)
from tfc.cache.locks import ImageHold, exclusive, remove_tree
from tfc.cache.manifest_parse import parse_manifest
from tfc.cache.publish import remove_stale_temps, rename_into_place, write_manifest

SPACE_MARGIN = 1 << 30  # free bytes left over after an image is written
_FIELDS = {"family", "key", "key_inputs", "world", "plan", "meta"}
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the filesystem of `path` (tests replace this)."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@dataclass(frozen=True)
class SegmentSlot(SegmentRecord):
    """A reserved segment: its range in a data file of the rank folder being written."""

    index: int
    tier: str = TIER_DEVICE


class _SlotState:
    __slots__ = ("lock", "slot", "stream", "written")

    def __init__(self, slot: SegmentSlot) -> None:
        self.slot = slot
        self.lock = threading.Lock()
        self.stream: _digest.StreamingDigest | None = _digest.StreamingDigest(slot.length)
        self.written = 0


class ImageWriter:
    """Builds one rank folder `<root>/<world_key[:16]>/rank{r}` in a temp sibling and publishes it atomically."""

    def __init__(self, root, world_key: str, rank: int, *, expected_bytes: int | None = None) -> None:
        if type(world_key) is not str or not HEX64.fullmatch(world_key):
            raise ImageError(f"world_key must be 64 lowercase hex characters, got {world_key!r:.80}")
        if type(rank) is not int or rank < 0:
            raise ImageError(f"rank must be a non-negative integer, got {rank!r}")
        self.root = Path(root)
        self.world_key = world_key
        self.rank = rank
        self.world_dir = self.root / world_key[:16]
        self.dest = self.world_dir / f"rank{rank}"
        self._hold = self._hold_world_dir()  # keeps rm/prune away while we build
        self._lock = threading.Lock()
        self._files: dict[str, int] = {}  # name -> fd
        self._cursor: dict[str, int] = {}
        self._states: list[_SlotState] = []
        self._names: set[str] = set()
        self._reserved = 0
        self._written = 0
        self._space_checked = 0
        self._done = False
        self.path = self.world_dir / f".tmp-rank{rank}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            with exclusive(self.world_dir):
                remove_stale_temps(self.world_dir)
                if expected_bytes is not None:
                    self._check_space(expected_bytes)
                self.path.mkdir()
        except BaseException:
            self._hold.release()
            raise

    # -- reserving and writing ------------------------------------------------------------------

    def add_segment(
        self,
        name: str,
        dtype: str,
        shape,
        layout: str,
        nbytes: int,
        file: str = "data.bin",
        tier: str = TIER_DEVICE,
        holes: int = 0,
    ) -> SegmentSlot:
        """Reserve a 4 KiB-aligned range for a segment at the end of `file` (call order = upload order);
        `tier` is where the runtime keeps it (cache/contract.py TIERS); `holes`, bytes it will get from
        write_zeros, take no disk space."""
        if type(name) is not str or not SEGMENT_NAME.fullmatch(name):
            raise ImageError(f"segment name {name!r:.80} is not allowed (letters, digits, _ . : + -)")
        if type(file) is not str or not FILE_NAME.fullmatch(file):
            raise ImageError(
                f"segment {name}: data file name {file!r:.80} must be a plain basename ending in .bin"
            )
        if dtype not in DTYPES:
            raise ImageError(f"segment {name}: unknown dtype {dtype!r}")
        if tier not in TIERS:
            raise ImageError(f"segment {name}: tier {tier!r:.40} is not one of {', '.join(TIERS)}")
        if type(layout) is not str or not ID.fullmatch(layout):
            raise ImageError(f"segment {name}: layout id {layout!r:.80} is malformed")
        shape = tuple(int(d) for d in shape)
        if len(shape) > MAX_NDIM or any(d < 0 for d in shape):
            raise ImageError(f"segment {name}: bad shape {shape}")
        spec = SegmentSpec(dtype, shape, layout)
        if spec.nbytes != nbytes:
            raise ImageError(f"segment {name}: shape {shape} of {dtype} is {spec.nbytes} bytes, not {nbytes}")
        with self._lock:
            self._check_open()
            if name in self._names:
                raise ImageError(f"segment {name} added twice")
            if file not in self._files:
                try:
                    fd = os.open(self.path / file, os.O_RDWR | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
                except OSError as error:
                    raise ImageError(f"cannot create {self.path / file}: {error.strerror}") from None
                self._files[file] = fd
                self._cursor[file] = 0
            offset = self._cursor[file]
            self._cursor[file] = align_up(offset + nbytes)
            slot = SegmentSlot(name, file, offset, nbytes, dtype, shape, layout, len(self._states), tier)
            self._states.append(_SlotState(slot))
            self._names.add(name)
            self._reserved += nbytes - min(max(holes, 0), nbytes)
            return slot

    def write(self, slot: SegmentSlot, rel_offset: int, data) -> None:
        """Write bytes at `rel_offset` within a slot (positional; safe from many threads).

        The digest is computed on the fly, in whatever order the slot's bytes arrive (each byte once).
        """
        state = self._state(slot)
        mv = memoryview(data)
        if not mv.c_contiguous:
            raise ImageError(f"segment {slot.name}: data must be C-contiguous")
        if mv.nbytes == 0:
            mv = memoryview(b"")
        elif mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        if rel_offset < 0 or rel_offset + len(mv) > slot.length:
            raise ImageError(
                f"segment {slot.name}: write of {len(mv)} bytes at {rel_offset} exceeds its {slot.length} bytes"
            )
        if self._reserved > self._space_checked:
            self._check_space()
        fd = self._files[slot.file]
        pos, view = slot.offset + rel_offset, mv
        try:
            while len(view):
                n = os.pwrite(fd, view, pos)
                view, pos = view[n:], pos + n
        except OSError as error:
            raise self._os_error(error, slot.file) from None
        state.stream.update(mv, rel_offset)  # any order: chunks are hashed as they complete
        with state.lock:
            state.written += len(mv)
        with self._lock:
            self._written += len(mv)

    def write_zeros(self, slot: SegmentSlot, rel_offset: int, length: int) -> None:
        """Let `length` bytes at `rel_offset` within a slot be zeros without writing them: the data file keeps a
        hole there (sparse sources stay sparse); the digest covers the zeros."""
        state = self._state(slot)
        if rel_offset < 0 or length < 0 or rel_offset + length > slot.length:
            raise ImageError(
                f"segment {slot.name}: {length} zero bytes at {rel_offset} exceed its {slot.length} bytes"
            )
        state.stream.update_zeros(rel_offset, length)
        with state.lock:
            state.written += length

    # -- publishing -----------------------------------------------------------------------------

    def publish(self, manifest_fields: dict, digests: dict | None = None) -> Path:
        """Digest, fsync, write the manifest last, rename into `rank{r}`; returns the published folder.

        `manifest_fields`: family, key, key_inputs, world, plan and optionally meta. `digests` may map
        segment names to SegmentDigest (or hex str for segments ≤ 4 MiB) computed by the caller.
        If another process published the same rank first, this one's work is discarded and the
        existing folder is returned.
        """
        self._check_open()
        unknown = set(manifest_fields) - _FIELDS
        if unknown:
            raise ImageError(f"unknown manifest fields {sorted(unknown)}")
        try:
            for st in self._states:
                if st.written < st.slot.length:
                    raise ImageError(
                        f"segment {st.slot.name}: only {st.written} of {st.slot.length} bytes were written"
                    )
            sizes = {name: align_up(self._cursor[name]) for name in self._files}
            for name, fd in self._files.items():
                os.ftruncate(fd, sizes[name])
            results = self._digests(digests or {})
            for fd in self._files.values():
                os.fsync(fd)
            self._close_files()
            body = {
                "format_version": FORMAT_VERSION,
                "family": manifest_fields.get("family"),
                "key": manifest_fields.get("key"),
                "world_key": self.world_key,
                "key_inputs": manifest_fields.get("key_inputs"),
                "world": manifest_fields.get("world"),
                "rank": self.rank,
                "plan": manifest_fields.get("plan"),
                "files": [{"name": n, "size": s} for n, s in sizes.items()],
                "segments": [self._entry(st.slot, results[st.slot.index]).to_dict() for st in self._states],
                "meta": manifest_fields.get("meta", {}),
            }
            manifest = parse_manifest(
                {**body, "root_digest": root_digest_of(body)}, f"manifest of {self.dest}"
            )
            write_manifest(self.path, manifest)
        except OSError as error:
            self.abort()
            raise self._os_error(error, "") from None
        except BaseException:
            self.abort()
            raise
        return self._rename()

    def abort(self) -> None:
        """Discard everything written (idempotent)."""
        if self._done:
            return
        self._done = True
        self._close_files()
        with contextlib.suppress(FileNotFoundError):
            remove_tree(self.path)
        self._hold.release()

    def __enter__(self) -> ImageWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.abort()

    # -- internals ------------------------------------------------------------------------------

    def _hold_world_dir(self) -> ImageHold:
        for _ in range(5):  # `tfc cache rm` may move the folder away between mkdir and the hold
            try:
                self.world_dir.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise ImageError(f"cannot create image folder {self.world_dir}: {error.strerror}") from None
            if not os.access(self.world_dir, os.W_OK):
                raise ImageError(f"image folder {self.world_dir} is not writable")
            try:
                return ImageHold(self.world_dir, create=True)
            except ImageError:
                continue
        raise ImageError(f"image folder {self.world_dir} keeps disappearing (a concurrent `tfc cache rm`?)")

    def _state(self, slot: SegmentSlot) -> _SlotState:
        if not isinstance(slot, SegmentSlot) or not 0 <= slot.index < len(self._states):
            raise ImageError(f"{slot!r:.80} is not a slot of this writer")
        state = self._states[slot.index]
        if state.slot != slot:
            raise ImageError(f"{slot.name} is not a slot of this writer")
        self._check_open()
        return state

    def _check_open(self) -> None:
        if self._done:
            raise ImageError(f"the writer of {self.dest} was already published or aborted")

    def _check_space(self, need: int | None = None) -> None:
        with self._lock:
            reserved = self._reserved
            pending = max(0, (need if need is not None else reserved) - self._written)
        free = free_bytes(self.world_dir)
        if free < pending + SPACE_MARGIN:
            raise ImageError(
                f"not enough free space in {self.world_dir.parent}: {pending / 1e9:.2f} GB still to write "
                f"+ {SPACE_MARGIN / 2**30:.0f} GiB margin, {free / 1e9:.2f} GB free; free space or use another --store"
            )
        with self._lock:
            self._space_checked = max(self._space_checked, reserved)

    def _os_error(self, error: OSError, file: str) -> ImageError:
        where = self.path / file if file else self.path
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            return ImageError(f"no space left writing {where}; free space or use another --store")
        return ImageError(f"cannot write {where}: {error.strerror or error}")

    def _digests(self, given: dict) -> dict[int, _digest.SegmentDigest]:
        out: dict[int, _digest.SegmentDigest] = {}
        reread: list[_SlotState] = []
        for st in self._states:
            d = given.get(st.slot.name)
            streamed = st.stream.result() if st.stream is not None and st.stream.complete else None
            if isinstance(d, str) and st.slot.length <= _digest.CHUNK:
                d = _digest.SegmentDigest(d)
            if isinstance(d, _digest.SegmentDigest):
                out[st.slot.index] = d  # trusted, except where the streamed digest gives a free cross-check
            elif streamed is not None:
                out[st.slot.index] = streamed
            else:
                reread.append(st)
            if streamed is not None and st.slot.index in out and out[st.slot.index] != streamed:
                raise ImageError(f"segment {st.slot.name}: given digest does not match the bytes written")
        if reread:
            out.update(self._rehash(reread))
        for st in reread:
            d = given.get(st.slot.name)
            if isinstance(d, str) and out[st.slot.index].digest != d:
                raise ImageError(f"segment {st.slot.name}: given digest does not match the bytes written")
        return out

    def _rehash(self, states: list[_SlotState]) -> dict[int, _digest.SegmentDigest]:
        """Re-read and hash segments in parallel over 64 MiB runs of chunks (one big segment uses all cores)."""
        per_task = _digest.BLOCK // _digest.CHUNK
        tasks = [
            (st.slot, c, min(c + per_task, _digest.chunk_count(st.slot.length)))
            for st in states
            for c in range(0, _digest.chunk_count(st.slot.length), per_task)
        ]
        local = threading.local()

        def run(task) -> list[bytes]:
            slot, first, last = task
            buf = getattr(local, "buf", None)
            if buf is None:
                buf = local.buf = bytearray(_digest.PIECE)
            start = first * _digest.CHUNK
            n = min(slot.length, last * _digest.CHUNK) - start
            return _digest.read_chunk_digests(self._files[slot.file], slot.offset + start, n, buf)

        raw: dict[int, list[bytes]] = {}
        with ThreadPoolExecutor(max_workers=min(len(tasks), os.cpu_count() or 1)) as pool:
            for (slot, _, _), digests in zip(tasks, pool.map(run, tasks), strict=True):
                raw.setdefault(slot.index, []).extend(digests)  # map keeps task order: chunks stay in order
        return {st.slot.index: _digest.finish(raw[st.slot.index], st.slot.length) for st in states}

    @staticmethod
    def _entry(slot: SegmentSlot, d: _digest.SegmentDigest) -> SegmentEntry:
        return SegmentEntry(
            slot.name,
            slot.file,
            slot.offset,
            slot.length,
            slot.dtype,
            slot.shape,
            slot.layout,
            d.digest,
            d.chunks,
            slot.tier,
        )

    def _close_files(self) -> None:
        for fd in self._files.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files = dict.fromkeys(self._files, -1)

    def _rename(self) -> Path:
        try:
            rename_into_place(self.path, self.dest, self.world_key, self.root)
        finally:
            self._done = True
            self._hold.release()
        return self.dest
