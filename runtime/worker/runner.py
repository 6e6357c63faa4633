"""The model runner's contract: the methods every runner has, the capabilities it states, and the small protocols
a stated capability adds (snapshots for the prefix cache, drafting, graph warm-up, stats, reading ahead).

The engine and the worker branch on `RunnerCapabilities`, never on which attributes a runner happens to have:
`snapshots_of(runner)` is the runner as its `Snapshots` exactly when it states `snapshot`, and so on. The worker
checks once, when it builds a runner, that every capability it states comes with its methods.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, cast, runtime_checkable

from tfc.runtime.worker.step import Capacity, ModelInfo, StepOutput, StepPlan, Upcoming

from tfc.errors import TfcError

if TYPE_CHECKING:  # torch is imported by the boot, after the early CUDA start (runtime/boot/cuda_start.py)
    import torch


@dataclass(frozen=True)
class RunnerCapabilities:
    """What a runner can do beyond running steps and releasing slots, as it states it."""

    snapshot: bool = False  # its slots can be saved and restored (`Snapshots`; the prefix cache needs it)
    draft: bool = False  # it drafts tokens and verifies them in one step (`Drafter`)
    draft_note: str = ""  # why it cannot draft (empty when it can)
    # prompt rows (SequenceStep.prompt) run another path than decode rows, so a state holding decoded rows is
    # not the same tokens' prefilled state
    prompt_rows: bool = False
    warmup: bool = False  # it captures its first graphs before the first step (`GraphWarmup`)
    stats: bool = False  # it reports counters and notes (`Reports`)
    prefetch: bool = False  # it reads what later prompt chunks need ahead of their steps (`Prefetches`)


class ModelRunner(Protocol):
    """A family's model on one rank (or a worker, or a TP world's leader): runs step plans over per-slot state."""

    @property
    def info(self) -> ModelInfo:
        """The model's vocabulary, context and special ids."""
        ...

    @property
    def capacity(self) -> Capacity:
        """Slots and tokens per slot."""
        ...

    @property
    def capabilities(self) -> RunnerCapabilities:
        """What it can do beyond `execute` and `release`."""
        ...

    def execute(self, plan: StepPlan) -> StepOutput:
        """Run one step; each planned sequence's state advances by its tokens."""
        ...

    def release(self, slot: int) -> None:
        """Forget a slot's state so a new sequence can take it."""
        ...


class Snapshot(Protocol):
    """A runner's self-contained copy of one slot's state at its position (what a prefix cache keeps)."""

    nbytes: int

    def to_host(self) -> Snapshot:
        """The same state in host memory (page-locked when it came from a GPU)."""
        ...

    def to_bytes(self) -> bytes:
        """The state as bytes the runner's `load_snapshot` reads back."""
        ...


@runtime_checkable
class Snapshots(Protocol):
    """What `snapshot` adds: a slot's state saved and restored."""

    def snapshot(self, slot: int) -> Snapshot:
        """A copy of a slot's state; the slot keeps running unchanged."""
        ...

    def restore(self, slot: int, snapshot: Snapshot) -> None:
        """Put a snapshot's state into a slot (the snapshot stays valid and unchanged)."""
        ...

    def load_snapshot(self, data: bytes) -> Snapshot:
        """The snapshot `Snapshot.to_bytes` wrote (a typed error for bytes it cannot read)."""
        ...


class DraftAsk(NamedTuple):
    """One sequence's part of a draft: its slot, the token it sampled and has not fed yet, the most tokens to draft."""

    slot: int
    last_token: int
    k: int


# Picks draft i of several sequences at once: (i, the drafter's logits [n, V] of the asks `which` (their indices
# in the draft's asks)) -> n tokens, a list or a tensor that may stay on the logits' device.
ChooseRows = Callable[[int, "torch.Tensor", Sequence[int]], "Sequence[int] | torch.Tensor"]


@runtime_checkable
class Drafter(Protocol):
    """What `draft` adds: tokens drafted and verified in one step (speculative decoding)."""

    draft_block: int  # the most tokens one draft proposes

    def draft(self, asks: Sequence[DraftAsk], choose: ChooseRows | None = None) -> list[tuple[int, ...]]:
        """Up to k tokens to follow each ask's last token, every sequence in one draft; `choose` picks draft i
        of them all from the drafter's logits (default: the highest)."""
        ...

    def rollback(self, slot: int, position: int) -> None:
        """After a verify row, keep the slot's rows before `position` only: the state of a sequence fed that far."""
        ...


@runtime_checkable
class GraphWarmup(Protocol):
    """What `warmup` adds: the first graphs captured before any step is timed."""

    def warmup(self) -> None:
        """Capture the first decode step's graph on padding rows."""
        ...


@runtime_checkable
class Reports(Protocol):
    """What `stats` adds: counters and notes on how it runs."""

    def stats(self) -> dict:
        """A plain dict; `stages` (compiled stages by how they came) and `notes` (lines for the boot log)."""
        ...


@runtime_checkable
class Prefetches(Protocol):
    """What `prefetch` adds: the prompt chunks later steps feed, told before this step runs."""

    def prefetch(self, upcoming: tuple[Upcoming, ...]) -> None:
        """Start reading what those chunks' rows need (off-device Engram records) while the steps run."""
        ...


class CapabilityMissing(TfcError):
    """A runner that states a capability without the methods it takes."""


def snapshots_of(runner: ModelRunner) -> Snapshots | None:
    """The runner's save and restore where it states `snapshot`, else None."""
    return cast(Snapshots, runner) if runner.capabilities.snapshot else None


def drafter_of(runner: ModelRunner) -> Drafter | None:
    """The runner's drafting where it states `draft`, else None."""
    return cast(Drafter, runner) if runner.capabilities.draft else None


def stats_of(runner: ModelRunner | None) -> dict:
    """A runner's counters and notes where it states `stats`, else an empty dict."""
    return cast(Reports, runner).stats() if runner is not None and runner.capabilities.stats else {}


def prefetch(runner: ModelRunner, upcoming: tuple[Upcoming, ...]) -> None:
    """Tell a runner that states `prefetch` the prompt chunks later steps feed (none that does not)."""
    if upcoming and runner.capabilities.prefetch:
        cast(Prefetches, runner).prefetch(upcoming)


def check_capabilities(runner: ModelRunner, where: str) -> None:
    """Raise CapabilityMissing where a capability the runner states lacks the protocol it needs."""
    caps = runner.capabilities
    stated = {Snapshots: caps.snapshot, Drafter: caps.draft, GraphWarmup: caps.warmup, Reports: caps.stats,
              Prefetches: caps.prefetch}  # fmt: skip
    missing = [
        protocol.__name__ for protocol, on in stated.items() if on and not isinstance(runner, protocol)
    ]
    if missing:
        raise CapabilityMissing(
            f"{where}: the {type(runner).__name__} states capabilities it has no methods for ({', '.join(missing)})"
        )
