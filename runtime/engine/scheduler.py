"""Continuous batching: which sequences a step runs — every decoding row, plus prefill chunks up to a token budget.

Prefill chunks start at multiples of `chunk` tokens from the sequence's start, whatever else shares the
step, so a sequence is always prefilled in the same pieces: its state does not depend on the traffic
around it. A prompt resumed from the prefix cache starts mid-chunk and runs to the next multiple, so its
later chunks are a fresh prompt's. A step holds every decoding sequence (one row each) and then whole
chunks of prefilling sequences, oldest first, while the step stays within `budget` tokens; a step with no
decode rows always takes the oldest chunk, so a prompt larger than the budget still makes progress. A
decoding sequence with a draft gets one verify row, its last token then the draft (runtime/engine/drafting.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tfc.runtime.engine.draft_backoff import DraftBackoff
from tfc.runtime.worker.step import SequenceStep, StepPlan, Upcoming


@dataclass
class Running:
    """A sequence that holds a slot: its prompt, what was fed, and what it generated."""

    slot: int
    prompt: tuple[int, ...]
    generated: list[int] = field(default_factory=list)
    fed: int = 0  # tokens the worker has seen (the position of the next one fed)
    drafting: bool = False  # it drafts: the runner keeps what its drafter needs of its rows
    draft: tuple[int, ...] = ()  # the tokens drafted to follow its last token this step
    backoff: DraftBackoff = field(default_factory=DraftBackoff)  # when it drafts next
    every: bool = False  # its prompt's every logits come back (its prompt's logprobs)

    def fed_since(self, start: int) -> tuple[int, ...]:
        """The ids the worker saw from position `start` to `fed` (prompt, then generated)."""
        p = len(self.prompt)
        head = self.prompt[start : self.fed] if start < p else ()
        return head + tuple(self.generated[max(start, p) - p : max(self.fed - p, 0)])

    def ids_before(self, position: int) -> tuple[int, ...]:
        """The sequence's ids at positions below `position` (prompt, then generated)."""
        p = len(self.prompt)
        return self.prompt[:position] + tuple(self.generated[: max(position - p, 0)])

    @property
    def prefilling(self) -> bool:
        """Whether prompt tokens are still to be fed."""
        return self.fed < len(self.prompt)

    def next_chunk(self, chunk: int) -> tuple[int, ...]:
        """The prompt tokens of this sequence's next prefill chunk (up to the next multiple of `chunk`)."""
        end = min(len(self.prompt), (self.fed // chunk + 1) * chunk)
        return self.prompt[self.fed : end]


def plan_step(running: Sequence[Running], chunk: int, budget: int) -> StepPlan:
    """The rows of the next step, in the order of `running` (decode rows first, then prefill chunks)."""
    rows = [
        SequenceStep(r.slot, (r.generated[-1], *r.draft), r.fed, bool(r.draft), r.drafting)
        for r in running
        if not r.prefilling
    ]
    used = sum(len(row.tokens) for row in rows)
    for r in running:
        if r.prefilling:
            piece = r.next_chunk(chunk)
            if rows and used + len(piece) > budget:
                continue
            rows.append(SequenceStep(r.slot, piece, r.fed, drafting=r.drafting, prompt=True, every=r.every))
            used += len(piece)
    return StepPlan(tuple(rows))


def upcoming_chunks(plan: StepPlan, runs: Sequence[Running], chunk: int) -> tuple[Upcoming, ...]:
    """The prompt chunk each prefilling row's sequence feeds after this step (`runs` in plan order): what a runner
    may start reading for while this step runs."""
    out = []
    for row, r in zip(plan.rows, runs, strict=True):
        start = row.position + len(row.tokens)
        if row.prompt and start < len(r.prompt):
            out.append(Upcoming(r.slot, r.prompt, start, min(len(r.prompt), (start // chunk + 1) * chunk)))
    return tuple(out)
