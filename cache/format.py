"""The rank image format: limits, names, the manifest dataclasses and their canonical JSON."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property

import blake3
from tfc.cache.contract import TIER_DEVICE, SegmentRecord
from tfc.cache.key import canonical_json

FORMAT_VERSION = 1
ALIGN = 4096
MANIFEST_NAME = "manifest.json"
MAX_NDIM = 8

# Names that reach the filesystem are plain basenames; nothing read from a manifest is used as a path otherwise.
FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,59}\.bin")
SEGMENT_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,255}")
HEX64 = re.compile(r"[0-9a-f]{64}")


def align_up(n: int) -> int:
    """The next multiple of ALIGN at or above n."""
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class FileEntry:
    """One data file of a rank folder and its exact size in bytes."""

    name: str
    size: int


@dataclass(frozen=True)
class SegmentEntry(SegmentRecord):
    """A manifest's segment record: where it lies, what it holds, its digest (chunk digests when > 4 MiB)."""

    digest: str
    chunks: tuple[str, ...] = ()
    tier: str = TIER_DEVICE

    def to_dict(self) -> dict:
        """The segment as stored in manifest.json."""
        d = {
            "name": self.name,
            "file": self.file,
            "offset": self.offset,
            "length": self.length,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "layout": self.layout,
            "digest": self.digest,
        }
        if self.chunks:
            d["chunks"] = list(self.chunks)
        if self.tier != TIER_DEVICE:  # a device-only image's manifest reads as before placement existed
            d["tier"] = self.tier
        return d


@dataclass(frozen=True)
class RankManifest:
    """Everything a rank folder holds and how it was keyed; written last, read first."""

    format_version: int
    family: str
    key: str
    world_key: str
    key_inputs: dict
    world: int
    rank: int
    plan: dict
    files: list[FileEntry]
    segments: list[SegmentEntry]
    root_digest: str
    meta: dict = field(default_factory=dict)

    @cached_property
    def segment_map(self) -> dict[str, SegmentEntry]:
        """Segments by name."""
        return {s.name: s for s in self.segments}

    @property
    def total_bytes(self) -> int:
        """Bytes of all data files together."""
        return sum(f.size for f in self.files)

    def body(self) -> dict:
        """The manifest content the root digest covers (everything but the root digest)."""
        return {
            "format_version": self.format_version,
            "family": self.family,
            "key": self.key,
            "world_key": self.world_key,
            "key_inputs": self.key_inputs,
            "world": self.world,
            "rank": self.rank,
            "plan": self.plan,
            "files": [{"name": f.name, "size": f.size} for f in self.files],
            "segments": [s.to_dict() for s in self.segments],
            "meta": self.meta,
        }

    def compute_root_digest(self) -> str:
        """BLAKE3 hex of the canonical JSON of body()."""
        return root_digest_of(self.body())

    def to_json(self) -> str:
        """The manifest.json text (root digest included)."""
        return (
            json.dumps(
                {**self.body(), "root_digest": self.root_digest}, sort_keys=True, separators=(",", ":")
            )
            + "\n"
        )

    @classmethod
    def load(cls, path: str | os.PathLike) -> RankManifest:
        """Read and strictly validate a manifest file (or a rank folder's manifest.json)."""
        from tfc.cache.manifest_parse import read_manifest  # the parser builds this class

        return read_manifest(path)

    @classmethod
    def from_bytes(cls, data: bytes, source: str = "manifest") -> RankManifest:
        """Parse and strictly validate manifest bytes (hostile input)."""
        from tfc.cache.manifest_parse import manifest_from_bytes

        return manifest_from_bytes(data, source)


def root_digest_of(body: dict) -> str:
    """BLAKE3 hex of a manifest body's canonical JSON."""
    return blake3.blake3(b"tfc.manifest.v1\0" + canonical_json(body)).hexdigest()
