"""The image contract compiler and runtime share (stdlib only): layout ids, element dtypes, segment records.

A layout id names how a segment's bytes are arranged (a byte format, as a dtype is), never which model
they belong to; the compiler writes these ids and the runtime executes exactly these, so a new id is
added here and needs code on both sides.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

# The spelling of a layout id or a family name in a manifest.
ID = re.compile(r"[a-z0-9][a-z0-9_.-]{0,63}")

LAYOUT_TRELLIS = "exl3.trellis.v1"  # int16 [k/16, n/16, width]: one EXL3 linear's trellis tiles
LAYOUT_STACK = "exl3.experts.stack.v1"  # int16 [entries, k/16, n/16, width]: an expert table of one width
LAYOUT_RAGGED = "exl3.experts.ragged.v1"  # uint8 [bytes]: an expert table of mixed widths, entries 16-aligned
LAYOUT_TABLE_INDEX = "exl3.experts.index.v1"  # one int per table entry: byte offsets, widths or codebooks
LAYOUT_SCALES = "exl3.scales.v1"  # float16 suh / svh vectors of EXL3 linears
LAYOUT_NATIVE = "native.v1"  # a plain little-endian array of its dtype and shape
LAYOUT_ENGRAM_ROWS = "engram.rows.e4m3e8m0.v1"  # per row: head_dim e4m3 bytes, then head_dim/32 e8m0 bytes
LAYOUT_ENGRAM_ASSET = "engram.asset.v1"  # a little-endian host-side array the Engram hasher reads
LAYOUT_TOKENIZER = "tokenizer.json.v1"  # the pack's tokenizer.json, byte for byte

LAYOUTS = frozenset(
    {
        LAYOUT_TRELLIS,
        LAYOUT_STACK,
        LAYOUT_RAGGED,
        LAYOUT_TABLE_INDEX,
        LAYOUT_SCALES,
        LAYOUT_NATIVE,
        LAYOUT_ENGRAM_ROWS,
        LAYOUT_ENGRAM_ASSET,
        LAYOUT_TOKENIZER,
    }
)

# Where a segment lives while the model runs (the placement `tfc prepare` decides for a stated target): the device
# arena, pinned host memory the device reads, or records read on demand from NVMe. A manifest without one: device.
TIER_DEVICE = "device"
TIERS = (TIER_DEVICE, "host", "nvme")

# numpy-style dtype name -> bytes per element
DTYPES: dict[str, int] = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "float8_e4m3fn": 1,
    "float8_e8m0fnu": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
}


@dataclass(frozen=True)
class SegmentSpec:
    """What a segment holds: its element dtype, its shape and its layout id."""

    dtype: str
    shape: tuple[int, ...]
    layout: str

    @property
    def nbytes(self) -> int:
        """Bytes of a segment of this dtype and shape."""
        return math.prod(self.shape) * DTYPES[self.dtype]


@dataclass(frozen=True)
class SegmentRecord:
    """One segment of a rank folder: its name, where its bytes lie, and what they hold."""

    name: str
    file: str
    offset: int
    length: int
    dtype: str
    shape: tuple[int, ...]
    layout: str

    @property
    def spec(self) -> SegmentSpec:
        """What the segment holds, without where it lies."""
        return SegmentSpec(self.dtype, self.shape, self.layout)
