"""The worker's contract with the engine: a step plan in (each sequence's slot and new tokens), logits out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tfc.errors import TfcError

if TYPE_CHECKING:  # torch is imported by the boot, after the early CUDA start (runtime/boot/cuda_start.py)
    import torch


@dataclass(frozen=True)
class SequenceStep:
    """One sequence's share of a step: its slot, its new tokens (a prefill chunk or one decode token), the first's position.

    `verify`: the tokens are a draft-verify row (the last token, then drafts): the logits of every row come
    back and the runner can `rollback` the slot to any position inside it. `drafting`: the sequence drafts,
    so the runner keeps what its drafter needs of these rows once they are committed. `prompt`: the tokens are
    prompt tokens (a prefill chunk), which a runner may run through a path of its own for many rows; every
    prompt token must then be sent so marked, whatever the chunking, for its state not to depend on it.
    `every`: the logits of every row come back [n, V] (a prompt's logprobs), nothing else changes."""

    slot: int
    tokens: tuple[int, ...]
    position: int
    verify: bool = False
    drafting: bool = False
    prompt: bool = False
    every: bool = False


@dataclass(frozen=True)
class StepPlan:
    """The sequences one step runs, in the order their outputs come back."""

    rows: tuple[SequenceStep, ...]

    @property
    def tokens(self) -> int:
        """New tokens in the step, over all sequences."""
        return sum(len(r.tokens) for r in self.rows)


@dataclass(frozen=True)
class Upcoming:
    """A prompt chunk a later step will feed: `ids[start:stop]` of a sequence whose ids are `ids` (its prompt, not
    copied), in `slot`; a runner may start reading what those rows need while the current step runs."""

    slot: int
    ids: tuple[int, ...]
    start: int
    stop: int


class RowsUnavailable(TfcError):
    """A step that could not read what some sequences' rows need (an off-device table's record failed to read);
    nothing of the step ran: those sequences fail, the others can run again."""

    def __init__(self, message: str, slots: tuple[int, ...]) -> None:
        super().__init__(message)
        self.slots = slots


@dataclass(frozen=True)
class StepOutput:
    """The last-position logits [V] of each planned sequence, in plan order ([n, V], every row, for a verify row)."""

    logits: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Capacity:
    """How many sequences a worker holds at once and how many tokens each may reach."""

    slots: int
    tokens_per_slot: int


@dataclass(frozen=True)
class ModelInfo:
    """What the engine needs to know of a model: vocabulary, context, and its special ids."""

    family: str
    vocab_size: int
    context: int
    bos_id: int | None
    eos_ids: tuple[int, ...]
    warnings: tuple[str, ...] = ()  # what a user must be told about how this model runs


class ModelRunner(Protocol):
    """A family's model on one rank: runs step plans over per-slot state."""

    info: ModelInfo
    capacity: Capacity

    def execute(self, plan: StepPlan) -> StepOutput:
        """Run one step; each planned sequence's state advances by its tokens."""
        ...

    def release(self, slot: int) -> None:
        """Forget a slot's state so a new sequence can take it."""
        ...


def prefetch(runner: Any, upcoming: tuple[Upcoming, ...]) -> None:
    """Tell a runner that has a `prefetch` the prompt chunks later steps feed (a no-op for one without)."""
    fn = getattr(runner, "prefetch", None)
    if upcoming and callable(fn):
        fn(upcoming)


class Snapshot(Protocol):
    """A runner's self-contained copy of one slot's state at its position (what a prefix cache keeps)."""

    nbytes: int

    def to_host(self) -> Snapshot:
        """The same state in host memory (page-locked when it came from a GPU)."""
        ...

    def to_bytes(self) -> bytes:
        """The state as bytes the runner's `load_snapshot` reads back."""
        ...


class SnapshotRunner(Protocol):
    """The optional methods of a runner whose slots can be saved and restored (a prefix cache needs them)."""

    def snapshot(self, slot: int) -> Snapshot:
        """A copy of a slot's state; the slot keeps running unchanged."""
        ...

    def restore(self, slot: int, snapshot: Snapshot) -> None:
        """Put a snapshot's state into a slot (the snapshot stays valid and unchanged)."""
        ...

    def load_snapshot(self, data: bytes) -> Snapshot:
        """The snapshot `Snapshot.to_bytes` wrote (a typed error for bytes it cannot read)."""
        ...


def snapshot_runner(runner: Any) -> SnapshotRunner | None:
    """The runner itself when it can snapshot its slots, else None (`can_snapshot` False says no)."""
    if getattr(runner, "can_snapshot", True) is False:
        return None
    names = ("snapshot", "restore", "load_snapshot")
    return runner if all(callable(getattr(runner, n, None)) for n in names) else None


class DraftRunner(Protocol):
    """The optional methods of a runner that drafts tokens and verifies them in one step (speculative decoding)."""

    draft_block: int  # the most tokens one draft proposes

    def draft(
        self, slot: int, last_token: int, k: int, choose: Callable[[int, torch.Tensor], int] | None = None
    ) -> tuple[int, ...]:
        """Up to k tokens to follow `last_token` (sampled, not yet fed) in a slot; `choose(i, logits)` picks
        draft i from the drafter's logits (default: the highest)."""
        ...

    def rollback(self, slot: int, position: int) -> None:
        """After a verify row, keep the slot's rows before `position` only: the state of a sequence fed that far."""
        ...


def draft_runner(runner: Any) -> DraftRunner | None:
    """The runner itself when it can draft (`can_draft` True and the methods), else None."""
    if getattr(runner, "can_draft", False) is not True:
        return None
    names = ("draft", "rollback")
    return runner if all(callable(getattr(runner, n, None)) for n in names) else None
