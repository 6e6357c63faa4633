"""The fast runner: step plans -> fixed-shape steps of <= 16 rows, each replayed from (or captured into) the
graph cache by its key, over KV pages the slots hold; the runner contract of runtime/worker/step.py."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from tfc.runtime.models.dsv41.fast.forward import FastForward
from tfc.runtime.models.dsv41.fast.graph_keys import MAX_ROWS, StepKey
from tfc.runtime.models.dsv41.fast.step_plan import Tile, plan_tiles
from tfc.runtime.worker.step import Capacity, ModelInfo, SequenceStep, StepOutput, StepPlan

from tfc.errors import TfcError


class FastStepError(TfcError):
    """A step plan the fast runner cannot run (unknown slot, a position that does not follow, past capacity)."""


@dataclass
class _Slot:
    position: int = 0
    history: list[int] = field(default_factory=list)  # the last max_ngram - 1 tokens (Engram look-back)


class FastRunner:
    """Runs step plans through `FastForward`, one slot per sequence; Engram rows hashed on the host per step."""

    def __init__(self, forward: FastForward, graphs, hash_tables, row_lo: tuple[int, ...], info: ModelInfo,
                 capacity: Capacity, buckets: tuple[int, ...], notes: Iterable[str] = ()) -> None:  # fmt: skip
        self.forward = forward
        self.graphs = graphs
        self.info = info
        self.capacity = capacity
        self.buckets = buckets
        self.notes = tuple(notes)
        self._tables = hash_tables
        self._row_lo = row_lo
        self._slots: dict[int, _Slot] = {}
        arena = forward.weights.arena
        self._baked = [(t.data_ptr(), t.numel() * t.element_size())
                       for t in (*forward.buffers.tensors, *forward.kv.tensors)] + list(arena.buffers())  # fmt: skip

    @property
    def kv(self):
        """The worker's KV memory."""
        return self.forward.kv

    def execute(self, plan: StepPlan) -> StepOutput:
        """Each planned sequence's tokens through as many steps as they fill; the last-position logits of each."""
        self._check(plan)
        out: list[torch.Tensor | None] = [None] * len(plan.rows)
        for tile in plan_tiles(plan, self.kv.dummy_slot, self.buckets):
            logits = self._run(tile)
            for i, row in enumerate(tile.rows):
                if row.out is not None:
                    out[row.out] = logits[i].clone()
        return StepOutput(tuple(out))

    def logits_of(self, slot: int, tokens: list[int], position: int) -> torch.Tensor:
        """The logits [n, V] of every one of a sequence's new tokens (tests and benchmarks; steps as execute)."""
        self._check(StepPlan((SequenceStep(slot, tuple(tokens), position),)))
        rows = []
        for lo in range(0, len(tokens), MAX_ROWS):
            plan = StepPlan((SequenceStep(slot, tuple(tokens[lo : lo + MAX_ROWS]), position + lo),))
            tile = plan_tiles(plan, self.kv.dummy_slot, self.buckets)[0]
            rows.append(self._run(tile)[: len(tile.rows)].clone())
        return torch.cat(rows)

    def release(self, slot: int) -> None:
        """Free a slot: its pages go back to the pool; nothing on the device moves."""
        self._slots.pop(slot, None)
        if 0 <= slot < self.capacity.slots:
            self.kv.release(slot)

    def snapshot(self, slot: int):
        """A copy of a slot's KV rows, position and Engram look-back (the prefix cache's entry)."""
        from tfc.runtime.models.dsv41.fast.kv_snapshot import snapshot

        state = self._slots.get(slot)
        if state is None:
            raise FastStepError(f"slot {slot} holds no sequence to snapshot")
        return snapshot(self.kv, slot, state.position, tuple(state.history))

    def restore(self, slot: int, snap) -> None:
        """Put a snapshot's rows into a slot: fresh pages for its position, its rings and entries written back."""
        from tfc.runtime.models.dsv41.fast.kv_snapshot import restore

        if not 0 <= slot < self.capacity.slots:
            raise FastStepError(f"slot {slot} is outside this worker's {self.capacity.slots} slots")
        self._slots.pop(slot, None)
        restore(self.kv, slot, snap)
        self._slots[slot] = _Slot(snap.position, list(snap.history))

    def load_snapshot(self, data: bytes):
        """A snapshot from its bytes (KvSnapshotError for bytes that do not fit this KV layout)."""
        from tfc.runtime.models.dsv41.fast.kv_snapshot import load

        return load(self.kv, data)

    def warmup(self, keys: Iterable[StepKey] | None = None) -> None:
        """Run (and so capture) the steps of `keys` on padding rows only (the dummy slot); by default the
        one-row decode step of the first context bucket."""
        for key in keys if keys is not None else (StepKey(1, self.buckets[0]),):
            zeros = np.zeros(MAX_ROWS, np.int64)
            self.launch(Tile((), key, zeros, zeros, np.full(MAX_ROWS, self.kv.dummy_slot, np.int64)))

    def fill_context(self, slot: int, tokens: int) -> None:
        """Benchmarks only: make a slot hold `tokens` tokens of whatever its KV rows contain, without running them."""
        self.kv.ensure(slot, tokens)
        self._slots[slot] = _Slot(tokens, [0] * max(0, self._lookback()))

    def stats(self) -> dict:
        """Graph cache counters and KV memory figures."""
        from tfc.runtime.models.dsv41.fast.fusion import NOTES

        g = self.graphs.stats
        return {"notes": [*self.notes, *NOTES],"graphs": {"enabled": self.graphs.enabled, "captures": g.captures, "replays": g.hits,
                           "eager": g.eager, "held": g.held, "fallbacks": g.fallbacks, "evictions": g.evictions},
                "kv": {"bytes": self.kv.nbytes, "bytes_per_token": self.kv.layout.bytes_per_token,
                       "bytes_per_slot": self.kv.layout.bytes_per_slot, "free_pages": self.kv.pool.free_pages}}  # fmt: skip

    def _lookback(self) -> int:
        return 0 if self._tables is None else self._tables.max_ngram - 1

    def _check(self, plan: StepPlan) -> None:
        seen = set()
        for row in plan.rows:
            if not 0 <= row.slot < self.capacity.slots:
                raise FastStepError(f"slot {row.slot} is outside this worker's {self.capacity.slots} slots")
            if row.slot in seen or not row.tokens:
                raise FastStepError(f"slot {row.slot} appears twice in the plan or has no tokens")
            seen.add(row.slot)
            state = self._slots.get(row.slot)
            at = 0 if state is None else state.position
            if row.position != at:
                raise FastStepError(f"slot {row.slot} is at position {at}, the plan says {row.position}")
            if row.position + len(row.tokens) > self.capacity.tokens_per_slot:
                raise FastStepError(f"slot {row.slot} would pass its {self.capacity.tokens_per_slot} tokens")
            if min(row.tokens) < 0 or max(row.tokens) >= self.info.vocab_size:
                raise FastStepError(f"token ids must lie in [0, {self.info.vocab_size})")

    def _run(self, tile: Tile) -> torch.Tensor:
        for row in tile.rows:
            self.kv.ensure(row.slot, row.position + 1)
        logits = self.launch(tile)
        for row in tile.rows:
            state = self._slots.setdefault(row.slot, _Slot())
            state.position = row.position + 1
            if self._lookback():
                state.history = [*state.history, row.token][-self._lookback() :]
        return logits

    def launch(self, tile: Tile) -> torch.Tensor:
        """Run one step as it is (inputs in, graph replayed or captured, no slot bookkeeping); the static logits."""
        self.forward.buffers.load(tile, self._engram_ids(tile))
        return self.replay(tile.key)

    def replay(self, key: StepKey) -> torch.Tensor:
        """Run the step of `key` on the inputs already loaded (graphed when the cache may); the static logits."""
        self.graphs.run(key, lambda: self.forward.step(key), buffers=self._baked)
        return self.forward.buffers.logits

    def _engram_ids(self, tile: Tile) -> np.ndarray | None:
        """Table row ids [MAX_ROWS, layers, cols] of the tile's rows (padding rows: each shard's first row)."""
        if self._tables is None or not self.forward.engram:
            return None
        from tfc.runtime.models.dsv41.engram_hash import hash_ids

        cfg = self.forward.cfg
        out = np.empty((MAX_ROWS, len(self._row_lo), cfg.engram_cols), np.int64)
        out[:] = np.asarray(self._row_lo, np.int64)[None, :, None]
        i = 0
        while i < len(tile.rows):
            j = i
            while j < len(tile.rows) and tile.rows[j].slot == tile.rows[i].slot:
                j += 1
            state = self._slots.get(tile.rows[i].slot)
            back = [] if state is None else state.history
            out[i:j] = hash_ids(self._tables, [r.token for r in tile.rows[i:j]], back)
            i = j
        return out
