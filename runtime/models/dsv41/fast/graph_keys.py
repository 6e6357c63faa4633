"""Graph keys of the fast forward: a step's row bucket and context bucket fix its whole launch sequence."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

MAX_ROWS = 256  # rows of one decode step
CHUNK_ROWS = 16  # rows of one product launch: a row has the bits it has among 16, whatever the step
SEQ_ROWS = 16  # rows one sequence may put in one decode step (its KV ring keeps this many past the window)
ROW_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 32, 48, 64, 96, 128, 192, 256)
CONTEXT_STEP = 2048  # context buckets: multiples of this up to CONTEXT_LINEAR, then x CONTEXT_GROW
CONTEXT_LINEAR = 32768
CONTEXT_GROW = 1.25


@dataclass(frozen=True, order=True)
class StepKey:
    """What a captured step depends on: rows the MoE runs (padded live rows) and context tokens it scores."""

    rows: int
    context: int


def row_bucket(rows: int) -> int:
    """The smallest row bucket holding `rows` rows."""
    if not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"a step runs 1..{MAX_ROWS} rows, not {rows}")
    return ROW_BUCKETS[bisect.bisect_left(ROW_BUCKETS, rows)]


def chunked_rows(rows: int) -> int:
    """The rows an exact step's tensors have for a key of `rows` rows: whole CHUNK_ROWS chunks."""
    return -(-max(rows, 1) // CHUNK_ROWS) * CHUNK_ROWS


def context_buckets(limit: int, step: int = CONTEXT_STEP, linear: int = CONTEXT_LINEAR,
                    grow: float = CONTEXT_GROW) -> tuple[int, ...]:  # fmt: skip
    """Bucket ends up to the first >= limit: step, 2 step, ... linear, then each x grow rounded up to step."""
    out = [step]
    while out[-1] < limit:
        last = out[-1]
        nxt = last + step if last < linear else -(-int(last * grow) // step) * step
        out.append(max(nxt, last + step))
    return tuple(out)


def context_bucket(tokens: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket holding `tokens` tokens."""
    i = bisect.bisect_left(buckets, tokens)
    if i == len(buckets):
        raise ValueError(f"{tokens} tokens pass the largest context bucket {buckets[-1]}")
    return buckets[i]
