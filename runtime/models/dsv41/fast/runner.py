"""The fast runner: step plans -> fixed-shape steps of <= 16 rows, each replayed from (or captured into) the
graph cache by its key, over KV pages the slots hold; the runner contract of runtime/worker/runner.py.

With a drafter (runtime/models/dsv41/dspark/drafting.py) it drafts as the reference runner does: a verify row's logits
come back for every row, `rollback` keeps a slot's rows before a position (a position reset: rollback.py says
why that is exact), and the drafter gets the static hidden rows the step captured of committed positions only
(non-verify rows at once, a verify step's at its rollback, or whole at the slot's next call).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tfc.runtime.models.dsv41.dspark.drafting import DraftingRunner, SlotDrafter
from tfc.runtime.models.dsv41.fast.fed_tokens import FedTokens
from tfc.runtime.models.dsv41.fast.forward import FastForward, head_rows
from tfc.runtime.models.dsv41.fast.graph_keys import SEQ_ROWS, StepKey
from tfc.runtime.models.dsv41.fast.rollback import VerifyMark, draft_bound
from tfc.runtime.models.dsv41.fast.step_plan import Tile, plan_tiles
from tfc.runtime.worker.runner import RunnerCapabilities
from tfc.runtime.worker.step import Capacity, ModelInfo, SequenceStep, StepOutput, StepPlan, Upcoming

from tfc.errors import TfcError


class FastStepError(TfcError):
    """A step plan the fast runner cannot run (unknown slot, a position that does not follow, past capacity)."""


@dataclass
class _Slot:
    # every token fed (the Engram look-back is their tail)
    tokens: FedTokens = field(default_factory=FedTokens)

    @property
    def position(self) -> int:
        """The position of the next token."""
        return len(self.tokens)


class FastRunner(DraftingRunner):
    """Runs step plans through `FastForward`, one slot per sequence; Engram rows hashed on the host per step."""

    step_error = FastStepError

    def __init__(self, forward: FastForward, graphs, hash_tables, row_lo: tuple[int, ...], info: ModelInfo,
                 capacity: Capacity, buckets: tuple[int, ...], notes: Iterable[str] = (),
                 drafter: SlotDrafter | None = None,
                 draft_note: str = "this runner was built without a drafter",
                 prefill: FastForward | None = None) -> None:  # fmt: skip
        self.forward = forward
        self.prefill = prefill  # the wide steps prompt rows take (None: they take the decode steps)
        self.prefill_steps = 0
        self.graphs = graphs
        self.info = info
        self.capacity = capacity
        self.buckets = buckets
        self.notes = tuple(notes)
        self._tables = hash_tables
        self._row_lo = row_lo
        self._slots: dict[int, _Slot] = {}
        self.drafter = drafter  # a test may put a stand-in here (drafting.SlotDrafter)
        self.draft_note = draft_note  # why it cannot draft, when it cannot
        self._marks: dict[int, VerifyMark] = {}  # slot -> its open verify step
        arena = forward.weights.arena
        staged = [] if forward.staging is None else forward.staging.tensors
        self._baked = [(t.data_ptr(), t.numel() * t.element_size())
                       for t in (*forward.buffers.tensors, *forward.kv.tensors, *staged)] + list(arena.buffers())  # fmt: skip
        self._held = None  # the records of off-device Engram rows the plan running needs (engram_staging.py)
        self._upcoming: tuple[Upcoming, ...] = ()  # prompt chunks later steps feed: read once this plan's are

    @property
    def kv(self):
        """The worker's KV memory."""
        return self.forward.kv

    @property
    def draft_block(self) -> int:
        """The most tokens one draft proposes (within the window and one step: rollback.py)."""
        if self.drafter is None:
            return 0
        return draft_bound(
            self.drafter.block_size, self.kv.layout.window, min(self.kv.layout.step_rows, SEQ_ROWS)
        )

    def execute(self, plan: StepPlan) -> StepOutput:
        """Each planned sequence's tokens through as many steps as they fill; the last-position logits of each
        (every row's, [n, V], for a verify or `every` row)."""
        for row in plan.rows:
            self._settle(row.slot)
        self._check(plan)
        out: list[torch.Tensor | None] = [None] * len(plan.rows)
        every = {
            row.slot: [] for row in plan.rows if row.verify or row.every
        }  # slot -> its logits, a run a tile
        kept = {row.slot: [] for row in plan.rows if row.drafting} if self._wants_hidden(plan) else {}
        # read before anything runs: a failed read fails its rows' sequences alone
        self._held = self._read_plan(plan)
        self._read_ahead()
        try:
            for forward, tile in self._tiles(plan):
                logits = self._run(tile, forward, every)
                for lo, hi in _runs(tile):
                    slot = tile.rows[lo].slot
                    if slot in every:
                        every[slot].append(logits[lo:hi].clone())
                    elif tile.rows[hi - 1].out is not None:
                        out[tile.rows[hi - 1].out] = logits[hi - 1].clone()
                    if slot in kept:
                        kept[slot].append(forward.buffers.hidden[lo:hi].clone())
        finally:
            self._held = None
        for i, row in enumerate(plan.rows):
            hidden = torch.cat(kept[row.slot]) if row.slot in kept else None
            if row.verify or row.every:
                out[i] = torch.cat(every[row.slot])
            if row.verify:
                self._marks[row.slot] = VerifyMark(row.position, len(row.tokens), hidden)
            elif hidden is not None:
                self.drafter.commit(row.slot, row.position, hidden)
        return StepOutput(tuple(out))

    def _tiles(self, plan: StepPlan) -> list[tuple[FastForward, Tile]]:
        """The plan's steps and the forward each runs on: prompt rows through the prefill forward's wide steps
        (where there is one), the other rows through the decode steps, each in plan order."""
        out = []
        for wide in (True, False):
            index = [
                i for i, row in enumerate(plan.rows) if (row.prompt and self.prefill is not None) == wide
            ]
            if not index:
                continue
            part = StepPlan(tuple(plan.rows[i] for i in index))
            forward = self.prefill if wide else self.forward
            width = forward.buffers.rows
            out += [
                (forward, t) for t in plan_tiles(part, self.kv.dummy_slot, self.buckets, width, index, wide)
            ]
        return out

    @property
    def capabilities(self) -> RunnerCapabilities:
        """Snapshots, graph warm-up and stats always; drafting where a drafter was built; prompt rows on a path of
        their own with a prefill forward (a decoded state then differs in bits from the same tokens prefilled,
        so the engine caches prompt states only); reading ahead where Engram rows are off the device."""
        drafts = self.drafter is not None
        return RunnerCapabilities(snapshot=True, draft=drafts, draft_note="" if drafts else self.draft_note,
                                  prompt_rows=self.prefill is not None, warmup=True, stats=True,
                                  prefetch=self.forward.staging is not None)  # fmt: skip

    def _fed_tokens(self, slot: int) -> FedTokens | None:
        state = self._slots.get(slot)
        return None if state is None else state.tokens

    def rollback(self, slot: int, position: int) -> None:
        """Keep the rows of a slot's last verify step before `position` (a position reset: rollback.py); the
        drafter gets those rows."""
        mark = self._marks.get(slot)
        if mark is None:
            raise FastStepError(f"slot {slot} has no verify step to roll back")
        try:
            keep = mark.keep(position)
        except ValueError as error:
            raise FastStepError(f"slot {slot}: {error}") from None
        del self._marks[slot]
        self._slots[slot].tokens.truncate(position)
        self.kv.truncate(slot, position)
        if mark.hidden is not None and keep:
            self.drafter.commit(slot, mark.position, mark.hidden[:keep])

    def _settle(self, slot: int) -> None:
        """Commit a verify step the engine did not roll back: every row it fed."""
        if slot in self._marks:
            self.rollback(slot, self._slots[slot].position)

    def _wants_hidden(self, plan: StepPlan) -> bool:
        """Whether the drafter takes target hidden rows of this plan's drafting rows (FastStepError when the
        forward does not capture the layers it reads)."""
        layers = () if self.drafter is None else tuple(self.drafter.target_layers)
        if not layers or not any(row.drafting for row in plan.rows):
            return False
        if layers != self.forward.capture:
            raise FastStepError(
                f"the drafter reads layers {list(layers)}, the forward captures {list(self.forward.capture)}"
            )
        return True

    def logits_of(self, slot: int, tokens: list[int], position: int) -> torch.Tensor:
        """The logits [n, V] of every one of a sequence's new tokens (tests and benchmarks; steps as execute)."""
        self._settle(slot)
        self._check(StepPlan((SequenceStep(slot, tuple(tokens), position),)))
        rows = []
        for lo in range(0, len(tokens), SEQ_ROWS):
            plan = StepPlan((SequenceStep(slot, tuple(tokens[lo : lo + SEQ_ROWS]), position + lo),))
            tile = plan_tiles(plan, self.kv.dummy_slot, self.buckets)[0]
            rows.append(self._run(tile)[: len(tile.rows)].clone())
        return torch.cat(rows)

    def release(self, slot: int) -> None:
        """Free a slot: its pages go back to the pool; nothing on the device moves."""
        self._slots.pop(slot, None)
        self._marks.pop(slot, None)
        if self.drafter is not None:
            self.drafter.release(slot)
        if 0 <= slot < self.capacity.slots:
            self.kv.release(slot)

    def snapshot(self, slot: int):
        """A copy of a slot's KV rows and fed tokens (the prefix cache's entry); never mid-verify."""
        from tfc.runtime.models.dsv41.fast.kv.snapshot import snapshot

        state = self._slots.get(slot)
        if state is None:
            raise FastStepError(f"slot {slot} holds no sequence to snapshot")
        if slot in self._marks:
            raise FastStepError(f"slot {slot} holds rows not verified yet: roll it back before a snapshot")
        return snapshot(self.kv, slot, tuple(state.tokens))

    def restore(self, slot: int, snap) -> None:
        """Put a snapshot's rows into a slot: fresh pages for its position, its rings and entries written back
        (its drafter starts over)."""
        from tfc.runtime.models.dsv41.fast.kv.snapshot import restore

        if not 0 <= slot < self.capacity.slots:
            raise FastStepError(f"slot {slot} is outside this worker's {self.capacity.slots} slots")
        self.release(slot)
        restore(self.kv, slot, snap)
        self._slots[slot] = _Slot(FedTokens(snap.tokens))  # the snapshot's ids, not copied

    def load_snapshot(self, data: bytes):
        """A snapshot from its bytes (KvSnapshotError for bytes that do not fit this KV layout)."""
        from tfc.runtime.models.dsv41.fast.kv.snapshot import load

        return load(self.kv, data)

    def warmup(self, keys: Iterable[StepKey] | None = None) -> None:
        """Run (and so capture) the steps of `keys` on padding rows only (the dummy slot); by default the
        one-row decode step of the first context bucket."""
        for key in keys if keys is not None else (StepKey(1, self.buckets[0]),):
            rows = self.forward.buffers.rows
            zeros = np.zeros(rows, np.int64)
            self.launch(Tile((), key, zeros, zeros, np.full(rows, self.kv.dummy_slot, np.int64)))

    def fill_context(self, slot: int, tokens: int) -> None:
        """Benchmarks only: make a slot hold `tokens` tokens of whatever its KV rows contain, without running them."""
        self.kv.ensure(slot, tokens)
        self._slots[slot] = _Slot(FedTokens((0,) * tokens))

    def stats(self) -> dict:
        """Graph cache counters, the stage kernels it runs (stages.kernels_loaded) and KV memory figures."""
        from tfc.runtime.models.dsv41.fast.stages import kernels_loaded

        g = self.graphs.stats
        return {"notes": list(self.notes), "stage_kernels": kernels_loaded(), "graphs": {"enabled": self.graphs.enabled, "captures": g.captures, "replays": g.hits,
                           "eager": g.eager, "held": g.held, "fallbacks": g.fallbacks, "evictions": g.evictions},
                "kv": {"bytes": self.kv.nbytes, "bytes_per_token": self.kv.layout.bytes_per_token,
                       "bytes_per_slot": self.kv.layout.bytes_per_slot, "free_pages": self.kv.pool.free_pages},
                "prefill": {"rows": 0 if self.prefill is None else self.prefill.buffers.rows,
                            "steps": self.prefill_steps}}  # fmt: skip

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
            if row.verify and (len(row.tokens) > self.draft_block + 1 or row.position == 0):
                raise FastStepError(f"slot {row.slot}: a verify row of {len(row.tokens)} tokens at position "
                                    f"{row.position} (at most {self.draft_block + 1}, after a prefill)")  # fmt: skip

    def _run(self, tile: Tile, forward: FastForward | None = None, every: dict | None = None) -> torch.Tensor:
        for row in tile.rows:
            self.kv.ensure(row.slot, row.position + 1)
        if forward is self.prefill and forward is not None:
            self._load(forward, tile)
            # eager: a wide step amortises its launches over its rows; the head runs on the rows read
            read = []  # the rows whose logits are read: every row of an `every` slot, else each run's last
            for lo, hi in _runs(tile):
                if every and tile.rows[lo].slot in every:
                    read += range(lo, hi)
                elif tile.rows[hi - 1].out is not None:
                    read.append(hi - 1)
            read = head_rows(read)
            forward.step(tile.key, torch.tensor(read, dtype=torch.int64, device=self.kv.device))
            self.prefill_steps += 1
            logits = forward.buffers.logits
        else:
            logits = self.launch(tile)
        for row in tile.rows:
            self._slots.setdefault(row.slot, _Slot()).tokens.append(row.token)
        return logits

    def launch(self, tile: Tile) -> torch.Tensor:
        """Run one step as it is (inputs in, graph replayed or captured, no slot bookkeeping); the static logits."""
        self._load(self.forward, tile)
        return self.replay(tile.key)

    def _load(self, forward: FastForward, tile: Tile) -> None:
        """A tile's inputs into a forward's step buffers, and its off-device Engram records into the staging."""
        ids = self._engram_ids(tile)
        staging = forward.staging if ids is not None else None
        if staging is None:
            forward.buffers.load(tile, ids)
            return
        records = staging.records(ids, self._held)
        forward.buffers.load(tile, staging.local_ids(ids))
        staging.write(records)

    def _plan_ids(self, rows: Iterable[tuple[int, Sequence[int], Sequence[int]]]) -> dict[int, np.ndarray]:
        """This rank's Engram row ids [n, layers, cols] of (slot, tokens, the ids before them) by slot."""
        from tfc.runtime.models.dsv41.engram_hash import hash_ids

        first, last = self.forward.engram_span()
        return {slot: hash_ids(self._tables, tokens, back[len(back) - min(len(back), self._lookback()) :])[..., first:last]
                for slot, tokens, back in rows}  # fmt: skip

    def _read_plan(self, plan: StepPlan):
        """The off-device Engram records every row of the plan needs (None without staged layers); RowsUnavailable
        names the slots whose rows failed to read."""
        staging = self.forward.staging
        if staging is None or self._tables is None or not self.forward.engram:
            return None
        back = {
            row.slot: self._slots[row.slot].tokens if row.slot in self._slots else () for row in plan.rows
        }
        return staging.read_plan(self._plan_ids((row.slot, row.tokens, back[row.slot]) for row in plan.rows))

    def prefetch(self, upcoming: tuple[Upcoming, ...]) -> None:
        """The prompt chunks later steps feed: the next `execute` starts reading their off-device Engram records
        once its own are read, so they come in while its steps run (a no-op without off-device rows)."""
        self._upcoming = tuple(upcoming)

    def _read_ahead(self) -> None:
        upcoming, self._upcoming = self._upcoming, ()
        staging = self.forward.staging
        if not upcoming or staging is None or self._tables is None or not self.forward.engram:
            return
        n = self._lookback()
        ids = self._plan_ids(
            (u.slot, u.ids[u.start : u.stop], u.ids[max(0, u.start - n) : u.start]) for u in upcoming
        )
        staging.prefetch(np.concatenate(list(ids.values())))

    def replay(self, key: StepKey) -> torch.Tensor:
        """Run the step of `key` on the inputs already loaded (graphed when the cache may); the static logits."""
        self.graphs.run(key, lambda: self.forward.step(key), buffers=self._baked)
        return self.forward.buffers.logits

    def _engram_ids(self, tile: Tile) -> np.ndarray | None:
        """Table row ids [rows, layers, cols] of the tile's rows (padding rows: each shard's first row); a
        tensor-parallel rank's own hash columns only."""
        if self._tables is None or not self.forward.engram:
            return None
        from tfc.runtime.models.dsv41.engram_hash import hash_ids

        first, last = self.forward.engram_span()
        out = np.empty((len(tile.tokens), len(self._row_lo), last - first), np.int64)
        out[:] = np.asarray(self._row_lo, np.int64)[None, :, None]
        for lo, hi in _runs(tile):
            state = self._slots.get(tile.rows[lo].slot)
            back = [] if state is None else state.tokens[-self._lookback() :]
            out[lo:hi] = hash_ids(self._tables, [r.token for r in tile.rows[lo:hi]], back)[..., first:last]
        return out


def _runs(tile: Tile) -> list[tuple[int, int]]:
    """[lo, hi) of each run of consecutive rows of one slot in a tile."""
    out, lo = [], 0
    for i in range(1, len(tile.rows) + 1):
        if i == len(tile.rows) or tile.rows[i].slot != tile.rows[lo].slot:
            out.append((lo, i))
            lo = i
    return out
