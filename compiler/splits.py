"""Tensor-parallel partitions: 128-value blocks dealt to ranks, lower ranks taking one block more."""

from __future__ import annotations

from dataclasses import dataclass

from tfc.compiler.errors import PlanError

BLOCK = 128


@dataclass(frozen=True)
class Part:
    """One rank's share of a split dimension: values [start, stop)."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def block_parts(extent: int, world: int, what: str) -> list[Part]:
    """Split `extent` values into `world` parts on 128-value blocks; lower ranks take one block more."""
    if extent % BLOCK:
        raise PlanError(f"{what}: dimension {extent} is not a multiple of {BLOCK}")
    blocks = extent // BLOCK
    if blocks < world:
        raise PlanError(
            f"{what}: {blocks} blocks of {BLOCK} cannot give each of {world} ranks a whole block; "
            f"use a TP world of at most {blocks}"
        )
    base, extra = divmod(blocks, world)
    parts, start = [], 0
    for rank in range(world):
        size = (base + (1 if rank < extra else 0)) * BLOCK
        parts.append(Part(start, start + size))
        start += size
    return parts


def even_parts(extent: int, world: int, unit: int, what: str) -> list[Part]:
    """Split `extent` into `world` equal parts of whole `unit`s (heads, groups); refuse otherwise."""
    if extent % unit or (extent // unit) % world:
        raise PlanError(
            f"{what}: {extent // unit if unit else extent} units do not divide among {world} ranks"
        )
    size = extent // world
    return [Part(r * size, (r + 1) * size) for r in range(world)]
