"""A Worker is one rank: boot its image into the arena, build the family's model runner, execute step plans."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from tfc.runtime.boot.kernel_cache import use_store_cache
from tfc.runtime.boot.rank import Booted, boot
from tfc.runtime.models.family import Family, family_for
from tfc.runtime.options import RuntimeOptions
from tfc.runtime.worker.runner import (
    ChooseRows,
    DraftAsk,
    Drafter,
    GraphWarmup,
    ModelRunner,
    RunnerCapabilities,
    Snapshot,
    Snapshots,
    check_capabilities,
    drafter_of,
    prefetch,
    snapshots_of,
)
from tfc.runtime.worker.step import Capacity, ModelInfo, StepOutput, StepPlan, Upcoming

from tfc.errors import TfcError


class NoModel(TfcError):
    """A step asked of a worker that was booted without a model runner."""


class NoSnapshots(TfcError):
    """A snapshot asked of a worker whose runner cannot save its slots."""


class NoDrafter(TfcError):
    """A draft asked of a worker whose runner cannot draft."""


class Worker:
    """One rank's life: `start` (boot), `load_model` (the family's runner), `execute(plan)`, `close`; to the engine
    a `ModelRunner` stating its runner's capabilities, with the snapshot and draft methods they add."""

    def __init__(self, booted: Booted) -> None:
        self.booted = booted
        self.family: Family = family_for(booted.image.manifest.family, str(booted.image.path))
        self.runner: ModelRunner | None = None
        self.kind: str | None = None  # the runner kind load_model built (fast | reference)
        self.kernel_cache: Path | None = None  # where Triton keeps this GPU's compiled kernels (in the store)

    @classmethod
    def start(
        cls,
        image: str | Path,
        *,
        rank: int | None = None,
        device: str | None = None,
        method: str | None = None,
        verify: str | None = None,
        options: RuntimeOptions | None = None,
        jobs: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> Worker:
        """Boot one rank of an image (open, arena, upload, graphs), with `progress(done, total)` during upload;
        `options` are the command's (runtime/options.py; default: RuntimeOptions())."""
        booted = boot(
            image, rank=rank, device=device, method=method, verify=verify, options=options, threads=jobs,
            progress=progress,
        )  # fmt: skip
        try:
            return cls(booted)
        except BaseException:
            booted.close()
            raise

    @property
    def device(self) -> str:
        """The device the arena lives on."""
        return str(self.booted.arena.device)

    def load_model(
        self, *, dtype: Any, engram: bool = True, slots: int = 256,
        progress: Callable[[int, int], None] | None = None, kind: str = "auto", **options: Any,
    ) -> ModelRunner:  # fmt: skip
        """Build the family's model runner over the booted image (timed as the boot's `model` phase).

        kind: `fast` (kernels on the arena), `reference` (dense, fp64-wide) or `auto` (fast on CUDA, else
        reference); `options` go to the family (e.g. the fast runner's tokens_per_slot, kv_tokens; a rank's comm)."""
        if kind == "auto":
            kind = "fast" if self.booted.arena.device.type == "cuda" else "reference"
        self.kind = kind
        self.kernel_cache = use_store_cache(self.booted.image.path, self.device)
        with self.booted.phases.time("model", note=f"{self.family.name} {kind} forward") as ph:
            self.runner = self.family.build_runner(
                self.booted.image,
                kind=kind,
                booted=self.booted,
                device=self.device,
                dtype=dtype,
                engram=engram,
                slots=slots,
                progress=progress,
                **options,
            )
            ph.note += f", {self.runner.capacity.slots} slots"
        check_capabilities(self.runner, str(self.booted.image.path))
        return self.runner

    def warm_up(self) -> None:
        """Capture the runner's first graphs (timed as the boot's `graphs` phase; a no-op for runners without)."""
        model = self._model()
        if model.capabilities.warmup and self.booted.graphs.enabled:
            with self.booted.phases.time("graphs") as ph:
                cast(GraphWarmup, model).warmup()
                ph.note = f"{self.booted.graphs.stats.captures} decode graph(s) captured"

    def _model(self) -> ModelRunner:
        if self.runner is None:
            raise NoModel(f"{self.booted.image.path}: this worker was booted without a model")
        return self.runner

    @property
    def info(self) -> ModelInfo:
        """The model's vocabulary, context and special ids."""
        return self._model().info

    @property
    def capacity(self) -> Capacity:
        """Slots and tokens per slot."""
        return self._model().capacity

    def execute(self, plan: StepPlan) -> StepOutput:
        """Run one step plan."""
        return self._model().execute(plan)

    def release(self, slot: int) -> None:
        """Free a slot for the next sequence."""
        self._model().release(slot)

    def prefetch(self, upcoming: tuple[Upcoming, ...]) -> None:
        """Tell the runner the prompt chunks later steps feed (it may start reading what their rows need)."""
        prefetch(self._model(), upcoming)

    @property
    def capabilities(self) -> RunnerCapabilities:
        """What the runner states it can do (where it cannot draft and gives no reason, the worker says why)."""
        caps = self._model().capabilities
        if caps.draft or caps.draft_note:
            return caps
        return replace(caps, draft_note=f"the {self.kind} forward has no drafter yet")

    def _snapshots(self) -> Snapshots:
        runner = snapshots_of(self._model())
        if runner is None:
            raise NoSnapshots(f"{self.booted.image.path}: the {self.kind} runner cannot snapshot its slots")
        return runner

    def snapshot(self, slot: int) -> Snapshot:
        """A copy of a slot's state."""
        return self._snapshots().snapshot(slot)

    def restore(self, slot: int, snapshot: Snapshot) -> None:
        """Put a snapshot's state into a slot."""
        self._snapshots().restore(slot, snapshot)

    def load_snapshot(self, data: bytes) -> Snapshot:
        """A snapshot from its bytes."""
        return self._snapshots().load_snapshot(data)

    @property
    def draft_block(self) -> int:
        """The most tokens one draft proposes (0 when the runner cannot draft)."""
        runner = drafter_of(self._model())
        return 0 if runner is None else runner.draft_block

    def _drafts(self) -> Drafter:
        runner = drafter_of(self._model())
        if runner is None:
            raise NoDrafter(
                f"{self.booted.image.path}: the {self.kind} runner cannot draft ({self.capabilities.draft_note})"
            )
        return runner

    def draft(self, asks: Sequence[DraftAsk], choose: ChooseRows | None = None) -> list[tuple[int, ...]]:
        """Up to k draft tokens after each ask's last token in its slot, every slot in one draft."""
        return self._drafts().draft(asks, choose)

    def rollback(self, slot: int, position: int) -> None:
        """Keep a slot's rows before `position` after a verify step."""
        self._drafts().rollback(slot, position)

    def chat_format(self, tokenizer: Any) -> Any:
        """The family's chat format over a tokenizer."""
        return self.family.chat_format(tokenizer, self.info.bos_id)

    def close(self) -> None:
        """Release the model, then the graphs, arena and image."""
        self.runner = None
        self.booted.close()
