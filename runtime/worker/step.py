"""The data of a step: a step plan in (each sequence's slot and new tokens), logits out (the runner: runner.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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


DEFAULT_SLOTS = 16  # a runner's slots where none are asked for and it cannot size them from free memory


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
