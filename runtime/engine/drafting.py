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

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
from tfc.runtime.engine.draft_backoff import DraftGate
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams, sample_rows_on
from tfc.runtime.engine.scheduler import Running
from tfc.runtime.worker.runner import ChooseRows, DraftAsk, Drafter, ModelRunner, drafter_of


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


def chooser(samplers: Sequence[tuple[SamplingParams, int, int]]) -> ChooseRows:
    """Draft i of several sequences, each (params, seed, position of its first draft) picked at position + i by
    its own keyed sampler, all in one batched call (the tokens `sample` gives row by row), left on the logits'
    device: the drafter's walk feeds them to its next product without waiting for the host."""

    def choose(i: int, logits: torch.Tensor, which: Sequence[int]) -> torch.Tensor:
        picked = [samplers[w] for w in which]
        seeds, at = [s for _, s, _ in picked], [p + i for *_, p in picked]
        return sample_rows_on(logits, [p for p, _, _ in picked], seeds, at)

    return choose


DRAFT_ROWS = 16  # rows a step's decode rows and drafts fill together by default: one product chunk


def share(decoding: int, rows: int) -> int:
    """Drafts each of `decoding` sequences may add so that their rows and drafts fill at most `rows` rows: a
    step of many streams drafts less, and none once their rows alone fill it (drafts never cost a product chunk
    of their own, so never a server's throughput)."""
    return max(0, rows // max(1, decoding) - 1)


class EngineDrafting:
    """The engine's drafting: its drafter (None: off) and the line that says why, the rounds so far, and the gate
    that stops rounds across sequences while they keep nothing."""

    def __init__(self, runner: ModelRunner, on: bool, off: str, metrics) -> None:
        self.drafter, self.note = open_drafting(runner, on, off)
        self.counts = DraftCounts()
        self.gate = DraftGate()
        self.metrics = metrics  # EngineMetrics: the rounds, drafted and accepted tokens

    @property
    def block(self) -> int:
        """The most tokens a round drafts (0: drafting off)."""
        return self.drafter.draft_block if self.drafter is not None else 0

    def stats(self) -> dict:
        """Whether drafting is on (and why not), with the rounds, drafted and accepted tokens so far."""
        return {"on": self.drafter is not None, "note": self.note, **self.counts.as_dict()}

    def propose(self, work: Sequence[tuple[Running, Request]], context: int, rows: int) -> None:
        """Set every decoding sequence's draft for this step (`propose`); a failing drafter turns drafting off,
        stated, and the step decodes serially."""
        for run, _ in work:
            run.draft = ()
        if self.drafter is None or not self.gate.open():
            return
        try:
            propose(self.drafter, work, context, rows)
        except Exception as error:  # decode serially from here on, and say so
            self.drafter, self.note = None, f"drafting off: a draft failed ({one_line(error)})"
            for run, _ in work:
                run.draft = ()

    def settle(self, run: Running, counts: DraftCounts, drafted: int, accepted: int) -> None:
        """After a round that kept `accepted` of `drafted` drafts: the runner rolled back to what was kept, the
        sequence's back-off and the gate told, the counts (the request's `counts` and the engine's) added to."""
        self.drafter.rollback(run.slot, run.fed)  # a verify row was planned only with drafting on
        run.backoff.after(accepted)
        self.gate.after(accepted)
        for c in (counts, self.counts):
            c.add(drafted, accepted)
        self.metrics.drafts.inc()
        self.metrics.draft_tokens.inc(drafted)
        self.metrics.accepted_tokens.inc(accepted)


def one_line(error: Exception) -> str:
    """One line naming an exception."""
    line = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {line}" if line else type(error).__name__


def propose(drafts: Drafter, work: Sequence[tuple[Running, Request]], context: int, rows: int) -> None:
    """Set `run.draft` of every decoding sequence that drafts (work: its Running and its Request), each within its
    share of `rows` rows, all of them in one draft."""
    most = min(drafts.draft_block, share(sum(not run.prefilling for run, _ in work), rows))
    if most == 0:
        return
    runs, asks, samplers = [], [], []
    for run, r in work:
        if run.prefilling or not run.drafting or not run.backoff.ready():
            continue
        k = draft_length(len(run.generated), run.fed, r.max_tokens, context, most)
        if k > 0:
            runs.append(run)
            asks.append(DraftAsk(run.slot, run.generated[-1], k))
            samplers.append((r.params, r.params.seed or 0, run.fed + 1))
    if asks:  # every drafting sequence in one draft
        for run, draft in zip(runs, drafts.draft(asks, chooser(samplers)), strict=True):
            run.draft = draft
