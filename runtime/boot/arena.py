"""The device arena: a rank's segments as views into a few large allocations at stable addresses.

The arena mirrors the rank's files: a chunk is one contiguous byte range of one file (segments in
upload order plus their 4 KiB padding), so filling a chunk is a few large copies and every
segment keeps its 4 KiB file alignment (hence >= 256 bytes on the device).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tfc.errors import TfcError

ALIGN = 256  # the device alignment every segment view keeps (cuBLAS and vector loads want it)
CHUNK_BYTES = 4 << 30  # the largest chunk unless a single segment is larger
GAP_BYTES = 1 << 20  # a hole this large between segments starts a new chunk rather than being copied

TORCH_DTYPES = {
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int16",
    "int32": "int32",
    "int64": "int64",
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "float8_e4m3fn": "float8_e4m3fn",
    "float8_e8m0fnu": "float8_e8m0fnu",
}


class ArenaError(TfcError):
    """An arena that cannot be planned or a view that does not fit its segment."""


@dataclass(frozen=True)
class UploadItem:
    """One segment to upload: where its bytes are in which file."""

    name: str
    path: Path
    offset: int
    length: int


@dataclass(frozen=True)
class Chunk:
    """One allocation: the byte range [offset, offset + nbytes) of one file."""

    path: Path
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Placement:
    """Where a segment lives: its chunk and its byte offset inside it."""

    chunk: int
    offset: int
    length: int


@dataclass(frozen=True)
class ArenaPlan:
    """Chunks to allocate and fill, and each segment's place in them."""

    chunks: tuple[Chunk, ...]
    placements: dict[str, Placement]

    @property
    def nbytes(self) -> int:
        """Bytes allocated (segments plus the padding between them)."""
        return sum(c.nbytes for c in self.chunks)

    @property
    def payload_bytes(self) -> int:
        """Bytes of segment payload."""
        return sum(p.length for p in self.placements.values())


def plan_arena(items: Iterable[UploadItem], chunk_bytes: int = CHUNK_BYTES) -> ArenaPlan:
    """Group segments by file and offset into chunks of at most `chunk_bytes` (bigger segments alone)."""
    by_file: dict[Path, list[UploadItem]] = {}
    names: set[str] = set()
    for item in items:
        if item.name in names:
            raise ArenaError(f"segment {item.name!r} appears twice")
        if item.offset < 0 or item.length < 0:
            raise ArenaError(f"segment {item.name!r} has a negative offset or length in {item.path}")
        if item.offset % ALIGN:
            raise ArenaError(f"segment {item.name!r} at offset {item.offset} of {item.path} is not aligned")
        names.add(item.name)
        by_file.setdefault(item.path, []).append(item)
    chunks: list[Chunk] = []
    placements: dict[str, Placement] = {}
    for path, group in by_file.items():
        group.sort(key=lambda i: i.offset)
        members: list[UploadItem] = []
        for item in group:
            if members:
                start, prev = members[0].offset, members[-1]
                if item.offset < prev.offset + prev.length:
                    raise ArenaError(f"segments {prev.name!r} and {item.name!r} overlap in {path}")
                too_far = item.offset - (prev.offset + prev.length) > GAP_BYTES
                if too_far or item.offset + item.length - start > chunk_bytes:
                    _close(chunks, placements, path, members)
                    members = []
            members.append(item)
        if members:
            _close(chunks, placements, path, members)
    return ArenaPlan(tuple(chunks), placements)


def _close(chunks: list[Chunk], placements: dict[str, Placement], path: Path, members: list[UploadItem]):
    start = members[0].offset
    end = max(m.offset + m.length for m in members)
    for m in members:
        placements[m.name] = Placement(len(chunks), m.offset - start, m.length)
    chunks.append(Chunk(path, start, end - start))


class DeviceArena:
    """The plan's chunks allocated on one device; segments are uint8 views at stable addresses."""

    def __init__(self, plan: ArenaPlan, device: Any = "cpu") -> None:
        import torch

        self.plan = plan
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.chunks: list[Any] = []
        self._backing: list[Any] = []
        for chunk in plan.chunks:
            # Over-allocate so the view can start on an ALIGN boundary whatever the allocator gives.
            raw = torch.empty(chunk.nbytes + ALIGN, dtype=torch.uint8, device=self.device)
            skip = (-raw.data_ptr()) % ALIGN
            self._backing.append(raw)
            self.chunks.append(raw[skip : skip + chunk.nbytes])

    @classmethod
    def over(cls, plan: ArenaPlan, chunks: Sequence[Any]) -> DeviceArena:
        """The same segment views over other chunk tensors (a host arena as the device addresses it)."""
        arena = cls.__new__(cls)
        arena.plan, arena.chunks, arena._backing = plan, list(chunks), []
        arena.device = chunks[0].device if chunks else None
        return arena

    @property
    def nbytes(self) -> int:
        """Bytes the arena holds (the chunks, padding included)."""
        return self.plan.nbytes

    def __contains__(self, name: str) -> bool:
        return name in self.plan.placements

    def names(self) -> list[str]:
        """Segment names in placement order."""
        return list(self.plan.placements)

    def raw(self, name: str) -> Any:
        """The segment's bytes as a uint8 tensor view."""
        try:
            p = self.plan.placements[name]
        except KeyError:
            raise ArenaError(f"the arena has no segment {name!r}") from None
        return self.chunks[p.chunk][p.offset : p.offset + p.length]

    def view(self, name: str, dtype: str, shape: Sequence[int]) -> Any:
        """The segment as a typed tensor view of the given shape (no copy)."""
        import torch

        if dtype not in TORCH_DTYPES or not hasattr(torch, TORCH_DTYPES[dtype]):
            raise ArenaError(f"segment {name!r}: dtype {dtype!r} has no torch equivalent")
        tdtype = getattr(torch, TORCH_DTYPES[dtype])
        raw = self.raw(name)
        count = 1
        for d in shape:
            count *= int(d)
        if count * tdtype.itemsize != raw.numel():
            raise ArenaError(
                f"segment {name!r}: {dtype}{list(shape)} needs {count * tdtype.itemsize} bytes, "
                f"the arena holds {raw.numel()}"
            )
        return raw.view(tdtype).view(tuple(int(d) for d in shape))

    def buffers(self) -> list[tuple[int, int]]:
        """(address, size) of every chunk: what a graph fingerprint bakes in."""
        return [(c.data_ptr(), c.numel()) for c in self.chunks]

    def release(self) -> None:
        """Drop the allocations (views held elsewhere keep their memory alive)."""
        self.chunks.clear()
        self._backing.clear()
