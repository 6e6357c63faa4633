"""The engine's draft-verify round: whether a runner drafts, how many tokens a sequence drafts, the counts.

A decoding sequence that drafts gets one verify row [last token, d1 .. dk] at its position p. After the step,
row i is sampled exactly as serial decoding samples the token at position p+i+1 (the sampler is keyed by seed
and position, runtime/engine/sampling.py; the constraint mask is the one after the tokens emitted before it),
and draft d(i+1) is accepted iff it equals that sample. The first sample that differs is emitted too (the
bonus) and the round ends there, as it does at a stop or a finish; the runner then keeps the rows that were
committed. So drafted output equals serial output token for token, greedy or sampled; this is not the
min(1, p/q) rule, which keeps only the distribution (docs/drafting.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams, sample
from tfc.runtime.engine.scheduler import Running
from tfc.runtime.worker.runner import Drafter, ModelRunner, drafter_of


@dataclass
class DraftCounts:
    """Draft-verify rounds, the tokens they proposed and how many of those were emitted as proposed."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def add(self, drafted: int, accepted: int) -> None:
        """Count one round."""
        self.drafts += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted

    def as_dict(self) -> dict[str, int]:
        """The counts by name."""
        return asdict(self)


def open_drafting(runner: ModelRunner, on: bool, off: str) -> tuple[Drafter | None, str]:
    """The runner's drafting (None when off) and the line that says so; `off` says why `on` is False."""
    if not on:
        return None, f"drafting off: {off}"
    drafts = drafter_of(runner)
    if drafts is None:
        return None, f"drafting off: {runner.capabilities.draft_note or 'the runner has no drafter'}"
    return drafts, f"drafting on: up to {drafts.draft_block} tokens a round, verified in one step"


def draft_length(generated: int, fed: int, max_tokens: int, context: int, block: int) -> int:
    """Tokens a decoding sequence may draft (`generated` ids so far, the last not yet fed; `fed` fed): a round
    emits at most k+1 tokens, and its rows stay inside the context."""
    left = max_tokens - generated - 1
    room = context - 2 - fed  # the last row's token must still be one serial decoding would emit
    return max(0, min(block, left, room))


def chooser(params: SamplingParams, seed: int, position: int) -> Callable[[int, torch.Tensor], int]:
    """Draft i (at position + i) picked from the drafter's logits by the request's own keyed sampler."""
    return lambda i, logits: sample(logits, params, seed, position + i)


DRAFT_ROWS = (
    16  # rows a decode step's rows and drafts fill together by default: one product chunk (CHUNK_ROWS)
)


def share(decoding: int, rows: int) -> int:
    """Drafts each of `decoding` sequences may add so that their rows and drafts fill at most `rows` rows: a
    step of many streams drafts less, and none once their rows alone fill it (drafts never cost a product chunk
    of their own, so never a server's throughput)."""
    return max(0, rows // max(1, decoding) - 1)


def propose(drafts: Drafter, work: Sequence[tuple[Running, Request]], context: int, rows: int) -> None:
    """Set `run.draft` of every decoding sequence that drafts (work: its Running and its Request), each within its
    share of `rows` rows."""
    most = min(drafts.draft_block, share(sum(not run.prefilling for run, _ in work), rows))
    if most == 0:
        return
    for run, r in work:
        if run.prefilling or not run.drafting or not run.backoff.ready():
            continue
        k = draft_length(len(run.generated), run.fed, r.max_tokens, context, most)
        if k > 0:
            choose = chooser(r.params, r.params.seed or 0, run.fed + 1)
            run.draft = drafts.draft(run.slot, run.generated[-1], k, choose)
