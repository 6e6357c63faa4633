"""The worker's contract with the engine: a step plan in (each sequence's slot and new tokens), logits out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # torch is imported by the boot, after the early CUDA start (runtime/boot/cuda_start.py)
    import torch


@dataclass(frozen=True)
class SequenceStep:
    """One sequence's share of a step: its slot, its new tokens (a prefill chunk or one decode token), the first's position."""

    slot: int
    tokens: tuple[int, ...]
    position: int


@dataclass(frozen=True)
class StepPlan:
    """The sequences one step runs, in the order their outputs come back."""

    rows: tuple[SequenceStep, ...]

    @property
    def tokens(self) -> int:
        """New tokens in the step, over all sequences."""
        return sum(len(r.tokens) for r in self.rows)


@dataclass(frozen=True)
class StepOutput:
    """The last-position logits [V] of each planned sequence, in plan order."""

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
