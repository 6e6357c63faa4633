"""Pack identity: a digest of what a key can afford to read, never of a path or an mtime."""

from __future__ import annotations

import os
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import blake3
from tfc.compiler.errors import BuildError
from tfc.packs.files import open_fd, read_bytes

SAMPLE_BLOCK = 64 << 10
SAMPLES = 8  # blocks per shard: the first, the last, and six evenly spaced between
STRICT_READ = 64 << 20
MAX_EXTRA_BYTES = 256 << 20  # config.json, tokenizer.json, the index: each is read whole


def sample_offsets(data_start: int, file_size: int) -> list[int]:
    """File offsets of the payload blocks sampled into a shard's identity."""
    span = file_size - data_start
    if span <= 0:
        return []
    if span <= SAMPLE_BLOCK * SAMPLES:
        return list(range(data_start, file_size, SAMPLE_BLOCK))
    last = file_size - SAMPLE_BLOCK
    return sorted({data_start + (last - data_start) * i // (SAMPLES - 1) for i in range(SAMPLES)})


def _header(fd: int, path: Path) -> bytes:
    head = os.pread(fd, 8, 0)
    if len(head) != 8:
        raise BuildError(f"{path}: shorter than a safetensors length prefix")
    (length,) = struct.unpack("<Q", head)
    raw = os.pread(fd, length, 8)
    if len(raw) != length:
        raise BuildError(f"{path}: header shorter than its declared {length} bytes")
    return head + raw


def _shard_digest(path: Path, strict: bool) -> bytes:
    fd = open_fd(path, BuildError)
    try:
        size = os.fstat(fd).st_size
        header = _header(fd, path)
        h = blake3.blake3(b"tfc.shard.v1\0" + size.to_bytes(8, "little") + header)
        if strict:
            offset = len(header)
            while offset < size:
                chunk = os.pread(fd, min(STRICT_READ, size - offset), offset)
                if not chunk:
                    raise BuildError(f"{path}: short read at byte {offset}")
                h.update(chunk)
                offset += len(chunk)
        else:
            for offset in sample_offsets(len(header), size):
                h.update(offset.to_bytes(8, "little") + os.pread(fd, SAMPLE_BLOCK, offset))
        return h.digest()
    finally:
        os.close(fd)


def pack_identity(shards: list[Path], extra_files: list[Path], strict: bool = False, jobs: int = 4) -> dict:
    """The identity of a pack: every header, every file size, sampled (or all) payload bytes.

    `extra_files` (config.json, tokenizer.json, the index) are digested whole; they are small.
    """
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        digests = list(pool.map(lambda p: _shard_digest(p, strict), shards))
    h = blake3.blake3(b"tfc.pack.v1\0")
    for digest in digests:
        h.update(digest)
    for path in extra_files:
        data = read_bytes(path, MAX_EXTRA_BYTES, BuildError)
        h.update(len(data).to_bytes(8, "little") + data)
    return {
        "digest": h.hexdigest(),
        "mode": "strict" if strict else "sampled",
        "shards": len(shards),
        "bytes": sum(os.stat(p).st_size for p in shards),
    }
