"""Step plans cut into fixed-shape steps (host side): every token of a plan becomes one row of a <= 16-row step.

A plan's rows (prefill chunks and decode tokens) are flattened in plan order and cut into steps of at most
MAX_ROWS rows; a sequence's later tokens always land in the same or a later step, and a step may hold several
tokens of one sequence (the forward writes every row's keys before any row reads them). Rows past the live
ones are padding: the dummy slot at position 0. A step's key is its row bucket and the context bucket of its
furthest row, so decode and prefill run the same graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tfc.runtime.models.dsv41.fast.graph_keys import MAX_ROWS, StepKey, context_bucket, row_bucket
from tfc.runtime.worker.step import StepPlan


@dataclass(frozen=True)
class TileRow:
    """One token of a step: its slot, id and position; `out` = the plan row it ends (its logits are returned)."""

    slot: int
    token: int
    position: int
    out: int | None = None


@dataclass(frozen=True)
class Tile:
    """One fixed-shape step: its live rows, key and the padded int64 inputs [rows] (tokens, positions, slots)."""

    rows: tuple[TileRow, ...]
    key: StepKey
    tokens: np.ndarray
    positions: np.ndarray
    slots: np.ndarray


def flatten(plan: StepPlan) -> list[TileRow]:
    """Every token of a plan as a row, in plan order; the last token of each plan row carries its index."""
    out: list[TileRow] = []
    for i, row in enumerate(plan.rows):
        n = len(row.tokens)
        out.extend(
            TileRow(row.slot, int(t), row.position + j, i if j == n - 1 else None)
            for j, t in enumerate(row.tokens)
        )
    return out


def make_tile(
    rows: Sequence[TileRow], dummy_slot: int, buckets: tuple[int, ...], width: int = MAX_ROWS
) -> Tile:
    """A step of these live rows padded to `width` rows (the dummy slot, token 0, position 0); its key's rows are
    the row bucket, or on a prefill step (width > MAX_ROWS, never graphed) the live rows themselves."""
    n = len(rows)
    tokens = np.zeros(width, np.int64)
    positions = np.zeros(width, np.int64)
    slots = np.full(width, dummy_slot, np.int64)
    for i, r in enumerate(rows):
        tokens[i], positions[i], slots[i] = r.token, r.position, r.slot
    context = context_bucket(max((r.position + 1 for r in rows), default=1), buckets)
    key_rows = row_bucket(max(n, 1)) if width <= MAX_ROWS else max(n, 1)
    return Tile(tuple(rows), StepKey(key_rows, context), tokens, positions, slots)


def plan_tiles(
    plan: StepPlan,
    dummy_slot: int,
    buckets: tuple[int, ...],
    width: int = MAX_ROWS,
    index: Sequence[int] | None = None,
) -> list[Tile]:
    """The plan's tokens as consecutive steps of at most `width` rows (`index`: what each plan row's `out` says
    instead of its place in this plan)."""
    rows = flatten(plan)
    if index is not None:
        rows = [r if r.out is None else TileRow(r.slot, r.token, r.position, index[r.out]) for r in rows]
    return [make_tile(rows[i : i + width], dummy_slot, buckets, width) for i in range(0, len(rows), width)]
