"""Drafting on the dsv41 runners (reference, fast): each slot's DSpark context of committed target rows, and its drafts.

The runner hands a slot drafter the target hidden rows of committed positions only (`commit`); rows a verify
step fed are committed once the engine says how many it kept, so the drafter never sees a rejected row and
needs no rollback of its own. Rows wait, unobserved, until the slot drafts; only the last `window` of them
can reach the DSpark rings, so older ones are dropped on arrival. A slot whose rows skipped positions (it
was resumed from a prefix-cache snapshot, which holds no drafter state) starts a fresh context there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
from tfc.runtime.models.dsv41.dspark.drafter import (
    DraftError,
    DraftInput,
    DsparkDrafter,
    chosen_among,
    greedy_rows,
)
from tfc.runtime.models.dsv41.dspark.state import DraftState
from tfc.runtime.models.dsv41.reference.forward import Dsv41Model, MissingWeight
from tfc.runtime.worker.runner import ChooseRows, DraftAsk

# A draft is verified while the confidence head's chance that it and every draft before it are accepted (the
# product of sigmoid(c_i)) is at least what its verify row costs in one-row steps: a 6-row window took 1.46x a
# one-row step on an H200 (benchmarks/summaries/decode.md), ~0.1 a row.
VERIFY_FLOOR = 0.1


def worth_verifying(confidence: torch.Tensor | None, k: int, floor: float = VERIFY_FLOOR) -> int:
    """Of k drafts, how many to verify: while the running product of sigmoid(confidence) stays >= floor (the
    DSpark paper's reading of the head; all k where the model has no confidence head)."""
    if confidence is None:
        return k
    chance = torch.cumprod(torch.sigmoid(confidence.double()[:k]), 0)
    return int((chance >= floor).sum())


class SlotAsk(NamedTuple):
    """One slot's part of a draft: the tokens it was fed, the token to follow, the most tokens to draft."""

    slot: int
    tokens: Sequence[int]
    last_token: int
    k: int


class SlotDrafter(Protocol):
    """What the runner asks of a drafter (the DSpark one, or a test's scripted stand-in)."""

    block_size: int  # the most tokens one draft proposes
    target_layers: tuple[int, ...]  # backbone layers whose input rows `commit` wants (none: no rows)

    def commit(self, slot: int, position: int, hidden: torch.Tensor) -> None:
        """Committed target rows [n, width] of positions position .. position+n-1."""
        ...

    def propose(self, asks: Sequence[SlotAsk], choose: ChooseRows) -> list[tuple[int, ...]]:
        """Up to k tokens to follow each ask's `last_token` after its slot's committed `tokens`, every slot in
        one draft; `choose` picks draft i of them all (its `which`: indices into `asks`)."""
        ...

    def release(self, slot: int) -> None:
        """Forget a slot."""
        ...


@dataclass
class SlotContext:
    """One slot's drafter state and the committed rows it has not observed yet."""

    state: DraftState
    rows: list[torch.Tensor] = field(default_factory=list)
    waiting: int = 0  # rows in `rows`

    @property
    def end(self) -> int:
        """The position after the last committed row it holds."""
        return self.state.position + self.waiting


class DsparkSlots:
    """A DSpark drafter over every slot of a runner (`DsparkDrafter`, or fast/dspark.py's, which has its interface)."""

    def __init__(self, drafter: DsparkDrafter, floor: float = VERIFY_FLOOR) -> None:
        self.drafter = drafter
        self.floor = floor  # worth_verifying's
        self.block_size = drafter.block_size
        self.target_layers = tuple(drafter.target_layers)
        self.window = drafter.config.sliding_window
        self.contexts: dict[int, SlotContext] = {}

    def commit(self, slot: int, position: int, hidden: torch.Tensor) -> None:
        """Keep committed rows for the slot's next draft (a fresh context where they do not follow its last)."""
        ctx = self.contexts.get(slot)
        if ctx is None or ctx.end != position:
            ctx = self.contexts[slot] = SlotContext(DraftState(position=position, start=position))
        ctx.rows.append(hidden)
        ctx.waiting += hidden.shape[0]
        extra = ctx.waiting - self.window
        while extra > 0:  # rows the rings could not keep anyway: skip them
            first = ctx.rows[0]
            cut = min(extra, first.shape[0])
            ctx.rows[0] = first[cut:]
            if ctx.rows[0].shape[0] == 0:
                ctx.rows.pop(0)
            ctx.state.position += cut
            ctx.waiting -= cut
            extra -= cut

    def propose(self, asks: Sequence[SlotAsk], choose: ChooseRows) -> list[tuple[int, ...]]:
        """Each ask's DSpark block's first k tokens that are worth a verify row (worth_verifying; none before its
        slot observed a row), the slots drafted together."""
        out: list[tuple[int, ...]] = [() for _ in asks]
        inputs, index = [], []
        width = len(self.target_layers) * self.drafter.config.hidden_size
        for a, (slot, tokens, last_token, k) in enumerate(asks):
            ctx = self.contexts.get(slot)
            if ctx is None or ctx.end != len(tokens) or ctx.end == ctx.state.start:
                continue
            hidden = torch.cat(ctx.rows) if ctx.rows else torch.empty(0, width)
            ctx.rows, ctx.waiting = [], 0
            inputs.append(DraftInput(ctx.state, hidden, last_token, k))
            index.append(a)
        drafts = self.drafter.draft_many(inputs, chosen_among(choose, index)) if inputs else []
        for a, draft in zip(index, drafts, strict=True):
            out[a] = draft.tokens[: worth_verifying(draft.confidence, len(draft.tokens), self.floor)]
        return out

    def release(self, slot: int) -> None:
        """Forget a slot's context."""
        self.contexts.pop(slot, None)


class DraftingRunner:
    """`draft` as both DeepSeek-V4.1 runners serve it: a subclass sets `drafter` (None: it cannot draft, as its
    capabilities state), `draft_note`, `draft_block`, `info`, `step_error` (the error it raises) and gives
    `_fed_tokens` and `_settle`."""

    drafter: SlotDrafter | None
    draft_note: str
    step_error: type[Exception] = ValueError

    def _fed_tokens(self, slot: int) -> Sequence[int] | None:
        """The tokens a slot was fed (None: the slot holds no sequence)."""
        raise NotImplementedError

    def _settle(self, slot: int) -> None:
        """Commit a verify step the engine did not roll back."""
        raise NotImplementedError

    def draft(self, asks: Sequence[DraftAsk], choose: ChooseRows | None = None) -> list[tuple[int, ...]]:
        """Up to k tokens to follow each ask's last token in its slot (none where it cannot draft yet), every
        slot in one draft; `choose` picks draft i of them all (default: the highest logit)."""
        if self.drafter is None:
            raise self.step_error(f"this runner cannot draft ({self.draft_note})")
        slot_asks, index = [], []
        for a, (slot, last_token, k) in enumerate(asks):
            tokens = self._fed_tokens(slot)
            if tokens is None:
                raise self.step_error(f"slot {slot} holds no sequence to draft for")
            self._settle(slot)
            k = min(k, self.draft_block)
            if k >= 1:
                slot_asks.append(SlotAsk(slot, tokens, last_token, k))
                index.append(a)
        out: list[tuple[int, ...]] = [() for _ in asks]
        if not slot_asks:
            return out
        drafts = self.drafter.propose(slot_asks, chosen_among(choose or greedy_rows, index))
        vocab = self.info.vocab_size
        for a, ask, draft in zip(index, slot_asks, drafts, strict=True):
            draft = tuple(int(t) for t in draft)[: ask.k]
            if any(not 0 <= t < vocab for t in draft):
                raise self.step_error(f"slot {ask.slot}: a draft {draft} outside the vocabulary [0, {vocab})")
            out[a] = draft
        return out


def dspark_slots(model: Dsv41Model) -> tuple[DsparkSlots | None, str]:
    """The DSpark drafter over a model's mtp blocks (decoded when first drafted), or None and why not."""
    try:
        return DsparkSlots(DsparkDrafter(model)), ""
    except (DraftError, MissingWeight) as error:
        return None, str(error).splitlines()[0]
