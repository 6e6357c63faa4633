"""The plan's vocabulary: segments of a rank image and the byte copies that fill them."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# Kinds a plan reports bytes by (the `tfc plan --json` keys); every segment has exactly one.
KINDS = (
    "routed_trellis",
    "shared_trellis",
    "other_trellis",
    "scales",
    "natives",
    "tables",
    "engram_rows",
    "engram_assets",
    "tokenizer",
)

# safetensors dtype name -> numpy dtype of the stored elements (bf16 carried as its uint16 bits).
STORED_NUMPY = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": np.uint16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.uint8,
    "F8_E4M3": np.uint8,
    "F8_E5M2": np.uint8,
    "F8_E8M0": np.uint8,
}

# safetensors dtype name -> the dtype a native is held in when no rule widens or narrows it.
STORED_HELD = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
}

# Held dtype -> item size; "float32_bf16" is float32 holding values first rounded to bf16.
HELD_ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "float32_bf16": 4,
    "bfloat16": 2,
    "float16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
}


@dataclass(frozen=True)
class Copy:
    """`rows` runs of `run` source bytes, `stride` apart from `src`, written back to back at `dst`."""

    file: Path
    src: int
    run: int
    rows: int = 1
    stride: int = 0
    dst: int = 0
    convert: tuple[str, str] | None = None  # (stored safetensors dtype, held numpy-style dtype)

    @property
    def span(self) -> int:
        """Bytes from the first source byte to the last, inclusive of gaps."""
        return (self.rows - 1) * self.stride + self.run if self.rows else 0

    @property
    def out_bytes(self) -> int:
        """Bytes this copy writes into its segment."""
        if self.convert is None:
            return self.run * self.rows
        stored, held = self.convert
        count = self.run // np.dtype(STORED_NUMPY[stored]).itemsize
        return count * HELD_ITEMSIZE[held] * self.rows


@dataclass(frozen=True)
class SegmentPlan:
    """One segment of a rank image: what it is, how large, and where its bytes come from."""

    name: str
    block: str  # "layers.3", "mtp.0" or "top"
    kind: str
    layout: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    copies: tuple[Copy, ...] = ()
    const: bytes | None = None  # bytes decided by the plan itself (table index arrays)
    derive: tuple | None = None  # a named builder for segments made from several tensors
    attrs: dict = field(default_factory=dict, compare=False, hash=False)
    holes: int = 0  # bytes whose source is a hole (a sparse file): zeros the image keeps as holes, no disk


@dataclass(frozen=True)
class Zeros:
    """A run of zero bytes a derived segment hands its writer instead of data: the image keeps it a hole."""

    nbytes: int


@dataclass(frozen=True)
class RankPlan:
    """Everything one rank's image holds, in upload order."""

    world: int
    rank: int
    segments: tuple[SegmentPlan, ...]

    @property
    def total(self) -> int:
        return sum(s.nbytes for s in self.segments)

    def bytes_by_block(self) -> dict[str, dict[str, int]]:
        """Bytes by kind for every block, in upload order."""
        out: dict[str, dict[str, int]] = {}
        for seg in self.segments:
            kinds = out.setdefault(seg.block, dict.fromkeys(KINDS, 0))
            shared = seg.attrs.get("shared_bytes", 0)
            kinds[seg.kind] += seg.nbytes - shared
            kinds["shared_trellis"] += shared
        return out
