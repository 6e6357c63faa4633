"""Byte geometry of EXL3 slices: the copies that move a rank's tiles and scales out of a pack."""

from __future__ import annotations

from tfc.compiler.segments import Copy
from tfc.compiler.splits import Part

TILE = 16
SCALE_BYTES = 2  # suh / svh are fp16


def whole(info) -> Copy:
    """The whole tensor, one contiguous run."""
    return Copy(info.file, info.offset, info.nbytes)


def trellis_rows(group, part: Part) -> Copy:
    """Rows [part) of the input dimension: one contiguous run of whole k-tile rows."""
    tn, tb = group.n // TILE, group.tile_bytes
    row_bytes = tn * tb
    return Copy(
        group.trellis.file,
        group.trellis.offset + part.start // TILE * row_bytes,
        part.size // TILE * row_bytes,
    )


def trellis_cols(group, part: Part) -> Copy:
    """Columns [part) of the output dimension: one strided run per k-tile row."""
    tk, tn, tb = group.k // TILE, group.n // TILE, group.tile_bytes
    return Copy(
        group.trellis.file,
        group.trellis.offset + part.start // TILE * tb,
        part.size // TILE * tb,
        rows=tk,
        stride=tn * tb,
    )


def vector_part(info, part: Part, itemsize: int = SCALE_BYTES) -> Copy:
    """Elements [part) of a vector (suh, svh, bias, sinks)."""
    return Copy(info.file, info.offset + part.start * itemsize, part.size * itemsize)


def group_slice(group, split: str, part: Part | None) -> tuple[tuple[int, int], Copy, Copy, Copy]:
    """(k, n) of the slice and the copies of its trellis, suh and svh for one split kind."""
    if split == "whole" or part is None:
        return (group.k, group.n), whole(group.trellis), whole(group.suh), whole(group.svh)
    if split == "column":
        return (group.k, part.size), trellis_cols(group, part), whole(group.suh), vector_part(group.svh, part)
    if split == "row":
        return (part.size, group.n), trellis_rows(group, part), vector_part(group.suh, part), whole(group.svh)
    raise ValueError(f"unknown split kind {split!r}")
