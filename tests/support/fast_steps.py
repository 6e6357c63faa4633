"""Step patterns the fast forward's exactness tests share (CPU and GPU): one sequence decoded among others."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tfc.runtime.worker.step import SequenceStep, StepPlan


def decode_alongside(runner, slot: int, tokens: list[int], others: dict[int, list[int]],
                     takes: Callable[[int, int], int], last: bool = False) -> torch.Tensor:  # fmt: skip
    """Logits [n, V] of `tokens` fed one a step in `slot` while other slot s feeds takes(step, s) tokens of its own
    sequence in the same steps (0: it sits out), the sequence's row first (`last`: after all of theirs); every
    slot is released afterwards."""
    at = dict.fromkeys(others, 0)
    got = []
    for i, t in enumerate(tokens):
        mine, rows = SequenceStep(slot, (t,), i), []
        for s, seq in others.items():
            take = takes(i, s)
            if take:
                rows.append(SequenceStep(s, tuple(seq[at[s] : at[s] + take]), at[s]))
                at[s] += take
        rows = [*rows, mine] if last else [mine, *rows]
        got.append(runner.execute(StepPlan(tuple(rows))).logits[-1 if last else 0])
    for s in (*others, slot):
        runner.release(s)
    return torch.stack(got)
