"""Step plans cut into fixed-shape steps (host side): every token of a plan becomes one row of a step.

A plan's rows (prefill chunks and decode tokens) are flattened in plan order and cut into steps of at most
MAX_ROWS rows, each holding at most SEQ_ROWS rows of one sequence (what its KV ring keeps past the window); a
sequence's later tokens always land in the same or a later step, and a step may hold several tokens of one
sequence (the forward writes every row's keys before any row reads them). Rows past the live ones are padding:
the dummy slot at position 0. A decode step's key is its row bucket and the context bucket of its furthest row,
so decode and prefill run the same graphs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tfc.runtime.models.dsv41.fast.graph_keys import MAX_ROWS, SEQ_ROWS, StepKey, context_bucket, row_bucket
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
    rows: Sequence[TileRow],
    dummy_slot: int,
    buckets: tuple[int, ...],
    width: int = MAX_ROWS,
    wide: bool = False,
) -> Tile:
    """A step of these live rows padded to `width` rows (the dummy slot, token 0, position 0); its key's rows are
    the row bucket, or on a prefill step (`wide`, never graphed) the live rows themselves."""
    n = len(rows)
    tokens = np.zeros(width, np.int64)
    positions = np.zeros(width, np.int64)
    slots = np.full(width, dummy_slot, np.int64)
    for i, r in enumerate(rows):
        tokens[i], positions[i], slots[i] = r.token, r.position, r.slot
    context = context_bucket(max((r.position + 1 for r in rows), default=1), buckets)
    key_rows = max(n, 1) if wide else row_bucket(max(n, 1))
    return Tile(tuple(rows), StepKey(key_rows, context), tokens, positions, slots)


def plan_tiles(
    plan: StepPlan,
    dummy_slot: int,
    buckets: tuple[int, ...],
    width: int = MAX_ROWS,
    index: Sequence[int] | None = None,
    wide: bool = False,
) -> list[Tile]:
    """The plan's tokens as consecutive steps of at most `width` rows, a decode step at most SEQ_ROWS of one
    sequence (`index`: what each plan row's `out` says instead of its place in this plan; `wide`: prefill steps,
    a sequence's rows up to the width)."""
    rows = flatten(plan)
    if index is not None:
        rows = [r if r.out is None else TileRow(r.slot, r.token, r.position, index[r.out]) for r in rows]
    return [
        make_tile(cut, dummy_slot, buckets, width, wide)
        for cut in cut_rows(rows, width, width if wide else SEQ_ROWS)
    ]


def cut_rows(rows: Sequence[TileRow], width: int, per_slot: int) -> list[list[TileRow]]:
    """Rows in order, cut into runs of at most `width` rows holding at most `per_slot` rows of one slot."""
    out: list[list[TileRow]] = []
    held: dict[int, int] = {}
    for r in rows:
        if not out or len(out[-1]) == width or held.get(r.slot, 0) == per_slot:
            out.append([])
            held = {}
        out[-1].append(r)
        held[r.slot] = held.get(r.slot, 0) + 1
    return out
