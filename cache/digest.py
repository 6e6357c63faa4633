"""Segment digests: BLAKE3 over 4 MiB chunks, so a sample of chunks can be checked on its own."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import blake3

# A segment of at most CHUNK bytes has digest = blake3(bytes). A longer one stores the blake3 of each
# CHUNK-sized piece and its digest is blake3 over (tag, length, CHUNK, those chunk digests): full
# verification then parallelises over chunks and `--sample` can check a subset against the manifest.
CHUNK = 4 << 20
BLOCK = 64 << 20  # bytes one re-hashing task covers (16 chunks)
PIECE = 512 << 10  # bytes per positional read: small enough to stay in L2 until hashed
_TAG = b"tfc.chunked.v1\0"
_PARALLEL_MIN = 4 * CHUNK

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


@dataclass(frozen=True)
class SegmentDigest:
    """A segment's digest and, for segments longer than CHUNK, its chunk digests (hex)."""

    digest: str
    chunks: tuple[str, ...] = ()


def chunk_count(length: int) -> int:
    """How many chunk digests a segment of `length` bytes has (an empty segment has one)."""
    return max(1, -(-length // CHUNK))


def combine(chunks: Sequence[bytes], length: int) -> str:
    """The digest of a segment longer than CHUNK from its raw chunk digests."""
    h = blake3.blake3(_TAG + length.to_bytes(8, "little") + CHUNK.to_bytes(8, "little"))
    for c in chunks:
        h.update(c)
    return h.hexdigest()


def finish(raw_chunks: Sequence[bytes], length: int) -> SegmentDigest:
    """Turn raw chunk digests into the SegmentDigest stored in a manifest."""
    if len(raw_chunks) != chunk_count(length):
        raise ValueError(f"{len(raw_chunks)} chunk digests for {length} bytes")
    if length <= CHUNK:
        return SegmentDigest(raw_chunks[0].hex())
    return SegmentDigest(combine(raw_chunks, length), tuple(c.hex() for c in raw_chunks))


def hash_chunk(buf) -> bytes:
    """The raw 32-byte BLAKE3 digest of one chunk (single-threaded; releases the GIL)."""
    return blake3.blake3(buf).digest()


@functools.lru_cache(maxsize=4)
def zero_chunk(size: int) -> bytes:
    """The raw digest of a chunk of `size` zero bytes (the same wherever the chunk lies)."""
    return hash_chunk(bytes(size))


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="tfc-digest")
        return _pool


def _bytes_view(buf) -> memoryview:
    mv = memoryview(buf)
    if not mv.c_contiguous:
        raise ValueError("digest input must be C-contiguous")
    if mv.nbytes == 0:
        return memoryview(b"")
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def chunk_digests(buf) -> list[bytes]:
    """Raw chunk digests of an in-memory buffer; large buffers are hashed on all cores."""
    mv = _bytes_view(buf)
    n = len(mv)
    if n <= CHUNK:
        return [blake3.blake3(mv, max_threads=blake3.blake3.AUTO if n >= (1 << 20) else 1).digest()]
    pieces = [mv[i : i + CHUNK] for i in range(0, n, CHUNK)]
    if n < _PARALLEL_MIN:
        return [hash_chunk(p) for p in pieces]
    return list(_executor().map(hash_chunk, pieces))


def segment_digest(buf) -> SegmentDigest:
    """The SegmentDigest of an in-memory buffer."""
    mv = _bytes_view(buf)
    return finish(chunk_digests(mv), len(mv))


def digest_bytes(buf) -> str:
    """The hex digest the manifest stores for a segment holding exactly `buf`."""
    return segment_digest(buf).digest


def read_chunk_digests(fd: int, offset: int, length: int, buf: bytearray | None = None) -> list[bytes]:
    """Raw digests of the chunks of file range [offset, offset+length), counted from `offset`.

    Reads PIECE-sized preads into a small reused buffer and hashes each piece while it is still in
    the CPU cache (measured ~2x faster than hashing out of a 64 MiB read buffer, cold and warm); the
    whole range is announced with POSIX_FADV_WILLNEED first so cold reads stay large underneath.
    Raises EOFError when the file ends before the range does.
    """
    if length == 0:
        return [hash_chunk(b"")]
    view = memoryview(buf if buf is not None else bytearray(PIECE))
    with contextlib.suppress(OSError):
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
    out: list[bytes] = []
    end = offset + length
    for chunk_start in range(offset, end, CHUNK):
        chunk_end = min(chunk_start + CHUNK, end)
        h = blake3.blake3()
        pos = chunk_start
        while pos < chunk_end:
            n = os.preadv(fd, [view[: min(len(view), chunk_end - pos)]], pos)
            if n == 0:
                raise EOFError(f"file ends at {pos}, expected {end}")
            h.update(view[:n])
            pos += n
        out.append(h.digest())
    return out


class StreamingDigest:
    """Digest of a segment whose bytes arrive in any order (never overlapping), hashed as they arrive.

    A write that covers a whole 4 MiB chunk is hashed at once; pieces of a chunk are gathered into one
    buffer until the chunk is complete, then hashed. So an image is digested while it is written, in
    whatever order parallel readers deliver its bytes, and never read back.
    """

    def __init__(self, length: int) -> None:
        self.length = length
        self._raw: list[bytes | None] = [None] * chunk_count(length)
        self._parts: dict[int, tuple[bytearray, int]] = {}
        self._lock = threading.Lock()
        self._done = 0
        if length == 0:
            self._raw[0] = hash_chunk(b"")

    @property
    def pos(self) -> int:
        """Bytes fed so far (the next offset, for bytes fed in order)."""
        return self._done

    def update(self, data, offset: int | None = None) -> None:
        """Feed bytes that belong at `offset` in the segment (default: right after the bytes fed so far)."""
        mv = _bytes_view(data)
        pos = self._done if offset is None else offset
        if pos < 0 or pos + len(mv) > self.length:
            raise ValueError(f"{len(mv)} bytes at {pos} overrun a {self.length}-byte segment")
        while len(mv):
            chunk = pos // CHUNK
            start = chunk * CHUNK
            size = min(CHUNK, self.length - start)
            take = min(len(mv), start + size - pos)
            if take == size:
                self._store(chunk, hash_chunk(mv[:take]), take)
            else:
                with self._lock:
                    buf, filled = self._parts.get(chunk) or (bytearray(size), 0)
                    buf[pos - start : pos - start + take] = mv[:take]
                    filled += take
                    if filled < size:
                        self._parts[chunk] = (buf, filled)
                        self._done += take
                        buf = None
                    else:
                        self._parts.pop(chunk, None)
                if buf is not None:
                    self._store(chunk, hash_chunk(buf), take)
            pos += take
            mv = mv[take:]

    def update_zeros(self, offset: int, length: int) -> None:
        """Feed `length` zero bytes at `offset` without materialising them (whole chunks hash once per size)."""
        if offset < 0 or offset + length > self.length:
            raise ValueError(f"{length} bytes at {offset} overrun a {self.length}-byte segment")
        pos, end = offset, offset + length
        while pos < end:
            chunk = pos // CHUNK
            start = chunk * CHUNK
            size = min(CHUNK, self.length - start)
            take = min(end, start + size) - pos
            if take == size:
                self._store(chunk, zero_chunk(size), take)
            else:
                self.update(bytes(take), pos)
            pos += take

    def _store(self, chunk: int, digest: bytes, took: int) -> None:
        with self._lock:
            self._raw[chunk] = digest
            self._done += took

    @property
    def complete(self) -> bool:
        """True once every byte of the segment was fed."""
        return self._done == self.length and None not in self._raw

    def result(self) -> SegmentDigest:
        """The finished SegmentDigest (only once complete)."""
        if not self.complete:
            raise ValueError(f"only {self._done} of {self.length} bytes fed")
        return finish(self._raw, self.length)
