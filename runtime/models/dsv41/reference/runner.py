"""The DeepSeek-V4.1 reference runner: step plans over the reference forward, one sequence state per slot.

With a drafter (the DSpark blocks, runtime/models/dsv41/dspark/drafting.py) it also drafts: a verify row is marked
before its forward (runtime/models/dsv41/reference/state.py `mark`), and `rollback` cuts the rows the engine rejected,
so a slot is always in the state of a sequence fed only what was committed. Rows of a verify step reach the
drafter once committed; a verify step never rolled back is committed whole by the slot's next call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tfc.packs.deepseek_v41_contract import FAMILY
from tfc.runtime.models.dsv41.dspark.drafting import DraftingRunner, SlotDrafter, dspark_slots
from tfc.runtime.models.dsv41.reference.engram import EngramFeed
from tfc.runtime.models.dsv41.reference.forward import Dsv41Model
from tfc.runtime.models.dsv41.reference.state import Mark, SequenceState
from tfc.runtime.models.dsv41.reference.state_io import StateSnapshot, state_from_bytes
from tfc.runtime.worker.runner import RunnerCapabilities
from tfc.runtime.worker.step import Capacity, ModelInfo, RowsUnavailable, StepOutput, StepPlan

from tfc.errors import TfcError


class StepError(TfcError):
    """A step plan the runner cannot run (unknown slot, a position that does not follow the slot's state)."""


class ReferenceRunner(DraftingRunner):
    """Runs step plans through `Dsv41Model`; Engram rows come from the feed, hashed over each slot's history."""

    step_error = StepError

    def __init__(
        self, model: Dsv41Model, feed: EngramFeed | None = None, slots: int = 256,
        drafter: SlotDrafter | None = None, draft_note: str = "this runner was built without a drafter",
    ) -> None:  # fmt: skip
        cfg = model.config
        self.model = model
        self.feed = feed if model.engram else None
        eos = () if cfg.eos_token_id is None else (int(cfg.eos_token_id),)
        warnings = ()
        if cfg.engram_layer_ids and not model.engram:
            warnings = (
                f"--no-engram: Engram layers {list(cfg.engram_layer_ids)} run WITHOUT their memory tables "
                "(gate off); outputs are not the model's",
            )
        self.info = ModelInfo(
            FAMILY, cfg.vocab_size, cfg.max_position_embeddings, cfg.bos_token_id, eos, warnings
        )
        self.capacity = Capacity(slots, cfg.max_position_embeddings)
        self._states: dict[int, SequenceState] = {}
        self.drafter = drafter  # a test may put a stand-in here (drafting.SlotDrafter)
        self.draft_note = draft_note  # why it cannot draft, when it cannot
        self._marks: dict[int, tuple[Mark, torch.Tensor | None]] = {}  # slot -> its open verify step

    @property
    def capabilities(self) -> RunnerCapabilities:
        """Snapshots always; drafting where a drafter was built."""
        drafts = self.drafter is not None
        return RunnerCapabilities(snapshot=True, draft=drafts, draft_note="" if drafts else self.draft_note)

    @property
    def draft_block(self) -> int:
        """The most tokens one draft proposes (its rows and the last token fit the window)."""
        if self.drafter is None:
            return 0
        return min(self.drafter.block_size, self.model.config.sliding_window - 1)

    def execute(self, plan: StepPlan) -> StepOutput:
        """Each planned sequence's next tokens in one batched forward; the last-position logits of each
        (every row's for a verify row)."""
        for row in plan.rows:
            self._settle(row.slot)
        states = [self._state(row.slot, row.position) for row in plan.rows]
        chunks = [list(row.tokens) for row in plan.rows]
        rows = None
        if self.feed is not None:
            rows = self._all_columns(self._feed_rows(plan, states, chunks))
        layers = None
        if self.drafter is not None and self.drafter.target_layers and any(r.drafting for r in plan.rows):
            layers = self.drafter.target_layers
        marks = {}
        for row, state in zip(plan.rows, states, strict=True):
            if row.verify:
                if len(row.tokens) > self.draft_block + 1 or state.position == 0:
                    raise StepError(f"slot {row.slot}: a verify row of {len(row.tokens)} tokens at position "
                                    f"{state.position} (at most {self.draft_block + 1}, after a prefill)")  # fmt: skip
                marks[row.slot] = state.mark(len(row.tokens))
        whole = layers is not None or bool(marks) or any(r.every for r in plan.rows)
        if layers is None:
            out, hidden = self.model.forward(chunks, states, rows, last_only=not whole), None
        else:
            out, hidden = self.model.forward(chunks, states, rows, last_only=False, capture=layers)
        for i, row in enumerate(plan.rows):
            kept = hidden[i] if hidden is not None and row.drafting else None
            if row.verify:
                self._marks[row.slot] = (marks[row.slot], kept)
            elif kept is not None:
                self.drafter.commit(row.slot, row.position, kept)
        return StepOutput(
            tuple(o if r.verify or r.every else o[-1] for o, r in zip(out, plan.rows, strict=True))
        )

    def _feed_rows(self, plan: StepPlan, states: list[SequenceState], chunks: list[list[int]]) -> list:
        """Each row's Engram rows, read before anything runs; RowsUnavailable names the slots whose rows failed
        to read from an off-device table."""
        from tfc.runtime.records.reader import RecordReadError

        out, failed, why = [], [], ""
        for row, state, chunk in zip(plan.rows, states, chunks, strict=True):
            try:
                out.append(self.feed.rows(state.tokens, chunk))
            except RecordReadError as error:
                failed.append(row.slot)
                why = why or str(error)
        if failed:
            raise RowsUnavailable(why, tuple(failed))
        return out

    def _fed_tokens(self, slot: int) -> list[int] | None:
        state = self._states.get(slot)
        return None if state is None else state.tokens

    def rollback(self, slot: int, position: int) -> None:
        """Keep the rows of a slot's last verify step before `position`; the drafter gets those rows."""
        entry = self._marks.get(slot)
        if entry is None:
            raise StepError(f"slot {slot} has no verify step to roll back")
        mark, hidden = entry
        try:
            self._states[slot].truncate(mark, position)  # checks before it changes anything
        except ValueError as error:
            raise StepError(f"slot {slot}: {error}") from None
        del self._marks[slot]
        if hidden is not None and position > mark.position:
            self.drafter.commit(slot, mark.position, hidden[: position - mark.position])

    def _settle(self, slot: int) -> None:
        """Commit a verify step the engine did not roll back: every row it fed."""
        if slot in self._marks:
            self.rollback(slot, self._states[slot].position)

    def _all_columns(self, rows: list[dict[int, torch.Tensor]]) -> list[dict[int, torch.Tensor]]:
        """Each sequence's Engram rows of every column: a TP rank's own columns, all-gathered in one call."""
        shard = self.model.shard
        if shard.world == 1:
            return rows
        layers = self.feed.layer_ids
        sizes = [next(iter(r.values())).shape[0] for r in rows]
        mine = torch.cat([torch.stack([r[layer] for layer in layers], 1) for r in rows])  # [n, L, cols, hd]
        mine = mine.to(self.model.device)  # the collectives' device (NCCL takes CUDA tensors only)
        every = shard.gather_last(mine.transpose(-1, -2), shard.engram_cols).transpose(-1, -2)
        return [{layer: part[:, k] for k, layer in enumerate(layers)} for part in every.split(sizes)]

    def release(self, slot: int) -> None:
        """Drop a slot's state (a no-op for a slot never used)."""
        self._states.pop(slot, None)
        self._marks.pop(slot, None)
        if self.drafter is not None:
            self.drafter.release(slot)

    def snapshot(self, slot: int) -> StateSnapshot:
        """A deep copy of a slot's state at its position (the prefix cache keeps it); never mid-verify."""
        state = self._states.get(slot)
        if state is None:
            raise StepError(f"slot {slot} holds no sequence to snapshot")
        if slot in self._marks:
            raise StepError(f"slot {slot} holds rows not verified yet: roll it back before a snapshot")
        return StateSnapshot.of(state.clone())

    def restore(self, slot: int, snapshot: StateSnapshot) -> None:
        """Replace a slot's state by a copy of a snapshot's, on this runner's device (its drafter starts over)."""
        if not 0 <= slot < self.capacity.slots:
            raise StepError(f"slot {slot} is outside this worker's {self.capacity.slots} slots")
        self.release(slot)
        self._states[slot] = snapshot.state.clone(self.model.device)

    def load_snapshot(self, data: bytes) -> StateSnapshot:
        """A snapshot from its bytes (StateFormatError for bytes that are not one)."""
        return StateSnapshot.of(state_from_bytes(data))

    def _state(self, slot: int, position: int) -> SequenceState:
        if not 0 <= slot < self.capacity.slots:
            raise StepError(f"slot {slot} is outside this worker's {self.capacity.slots} slots")
        state = self._states.get(slot)
        if state is None:
            if position != 0:
                raise StepError(f"slot {slot} is empty, but the plan starts it at position {position}")
            state = self._states[slot] = self.model.new_state()
        elif state.position != position:
            raise StepError(f"slot {slot} is at position {state.position}, the plan says {position}")
        return state


def build_reference(
    opened: Any, *, device: str, dtype: torch.dtype, engram: bool, slots: int | None,
    progress: Callable[[int, int], None] | None = None, comm: Any = None, off_device: Any = None,
) -> ReferenceRunner:  # fmt: skip
    """The reference runner over an opened rank image (`comm`: its world's collectives; none at TP=1):
    weights decoded to dense once, `progress(done, total)`; Engram rows the boot placed off the device
    (`off_device`: runtime/boot/tiers.py) are read from there; `slots=None`: DEFAULT_SLOTS."""
    from tfc.runtime.models.dsv41.reference.weights import dense_from_opened, engram_feed
    from tfc.runtime.models.dsv41.shard import shard_of
    from tfc.runtime.parallel.comm import SOLO
    from tfc.runtime.worker.step import DEFAULT_SLOTS

    cfg, weights = dense_from_opened(opened)
    shard = shard_of(opened.manifest, cfg, weights, comm or SOLO, device)
    feed = None
    if cfg.engram_layer_ids and engram:
        cols = shard.engram_cols[shard.rank] if shard.engram_cols else None
        feed = engram_feed(weights, cfg.engram_layer_ids, cfg.engram_head_dim, cols, off_device)
        if feed is None:
            raise MissingEngramTables(
                f"{opened.path}: the model has Engram layers {list(cfg.engram_layer_ids)} but the image holds "
                "no Engram tables; prepare it with --engram-dir, or pass --no-engram"
            )
    try:
        model = Dsv41Model(cfg, weights, dtype=dtype, device=device, engram=feed is not None, shard=shard)
    except (RuntimeError, ValueError) as error:
        raise StepError(f"device {device!r}: {str(error).splitlines()[0]}") from None
    names = [n for n in weights if not n.startswith("mtp.")]  # DSpark blocks stay undecoded
    for i, name in enumerate(names):
        weights[name]
        if progress is not None:
            progress(i + 1, len(names))
    drafter, note = dspark_slots(model)
    return ReferenceRunner(model, feed, DEFAULT_SLOTS if slots is None else slots, drafter, note)


class MissingEngramTables(TfcError):
    """A model with Engram layers whose image holds no Engram tables."""
