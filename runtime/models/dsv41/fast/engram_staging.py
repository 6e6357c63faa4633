"""Engram layers whose rows live off the device (host memory or NVMe): a step's records gathered on the host into
pinned staging, copied into a static device table, read by the same gather kernel as an arena shard.

The host knows a step's row ids before the step (it hashes them), so the runner reads every record a plan needs
before the plan's first step (`read_plan`: a failed read then fails only the sequences whose rows it was, with
nothing run) and writes each step's records into the pinned staging. Inside the step (captured with it) the
copies run on a side stream from the step's start and each Engram layer waits for its own, so they overlap the
layers before it. A staged layer's ids in the step's inputs are the staging rows [0, rows * cols) themselves;
padding rows read the shard's first record, as the arena path does: the staged table holds the bytes the arena
path reads, and the kernel decodes them alike.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from tfc.runtime.records.reader import RecordReadError
from tfc.runtime.records.source import RecordSource
from tfc.runtime.worker.step import RowsUnavailable


class PlanRecords:
    """The records a plan's rows need, per staged layer: distinct global row ids (sorted) and their records."""

    def __init__(self) -> None:
        self.layers: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def take(self, k: int, ids: np.ndarray) -> np.ndarray | None:
        """Records [n, bytes] of global `ids` of layer k, or None where the plan holds not all of them."""
        held = self.layers.get(k)
        if held is None:
            return None
        known, records = held
        at = np.minimum(np.searchsorted(known, ids), known.size - 1)
        return records[at] if bool((known[at] == ids).all()) else None


class EngramStaging:
    """Pinned host staging and a static device table of `rows` x `cols` records for each staged layer k."""

    def __init__(self, sources: Mapping[int, RecordSource], row_lo: tuple[int, ...], rows: int, cols: int,
                 device: torch.device) -> None:  # fmt: skip
        self.sources = dict(sources)
        self.row_lo = row_lo
        self.rows, self.cols = rows, cols
        self.device = device
        self.host: dict[int, torch.Tensor] = {}
        self.tables: dict[int, torch.Tensor] = {}
        cuda = device.type == "cuda"
        for k, src in self.sources.items():
            self.host[k] = torch.zeros((rows * cols, src.record_bytes), dtype=torch.uint8, pin_memory=cuda)
            self.tables[k] = torch.zeros_like(self.host[k], device=device) if cuda else self.host[k]
        self.local = np.arange(rows * cols, dtype=np.int64).reshape(rows, cols)
        self.stream = torch.cuda.Stream(device) if cuda else None
        self.events = {k: torch.cuda.Event() for k in self.sources} if cuda else {}
        self._live = rows * cols

    def __contains__(self, k: int) -> bool:
        return k in self.sources

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The device tables (what a graph bakes in besides the pinned staging it copies from)."""
        return list(self.tables.values()) + (list(self.host.values()) if self.stream is not None else [])

    def read_plan(self, ids_by_slot: Mapping[int, np.ndarray]) -> PlanRecords:
        """Every record the plan's rows need (global ids [n, layers, cols] by slot) and each shard's first; a
        failed read raises RowsUnavailable naming the slots whose rows failed."""
        held = PlanRecords()
        for k, src in self.sources.items():
            want = [
                np.asarray([self.row_lo[k]], np.int64),
                *(ids[:, k].reshape(-1) for ids in ids_by_slot.values()),
            ]
            known = np.unique(np.concatenate(want))
            try:
                held.layers[k] = (known, src.gather(known - self.row_lo[k]))
            except RecordReadError as error:
                raise RowsUnavailable(str(error), self._failing(k, src, ids_by_slot)) from None
        return held

    def _failing(self, k: int, src: RecordSource, ids_by_slot: Mapping[int, np.ndarray]) -> tuple[int, ...]:
        """The slots whose own rows of layer k fail to read (all of them where each reads alone)."""
        bad = []
        for slot, ids in ids_by_slot.items():
            try:
                src.gather(np.unique(ids[:, k]) - self.row_lo[k])
            except RecordReadError:
                bad.append(slot)
        return tuple(bad or ids_by_slot)

    def records(self, ids: np.ndarray, held: PlanRecords | None) -> dict[int, np.ndarray]:
        """Each staged layer's records [rows * cols, bytes] of a step's global ids [rows, layers, cols]: the plan's
        where it holds them, else read now."""
        out = {}
        for k, src in self.sources.items():
            flat = ids[:, k].reshape(-1)
            got = None if held is None else held.take(k, flat)
            out[k] = src.gather(flat - self.row_lo[k]) if got is None else got
        return out

    def local_ids(self, ids: np.ndarray) -> np.ndarray:
        """The step's ids with each staged layer's replaced by its staging rows."""
        ids = ids.copy()
        for k in self.sources:
            ids[: self.rows, k] = self.local
        return ids

    def write(self, records: Mapping[int, np.ndarray]) -> None:
        """Put a step's records into the pinned staging (once the stream is idle: the last step copied from it)."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).synchronize()
        for k, rec in records.items():
            self.host[k].numpy()[: rec.shape[0]] = rec

    def start(self, rows: int) -> None:
        """In the step: the copies of its `rows` rows' records, on the side stream, forked from the current."""
        self._live = rows * self.cols
        if self.stream is None:
            return
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)
        with torch.cuda.stream(self.stream):
            for k in self.sources:
                self.tables[k][: self._live].copy_(self.host[k][: self._live], non_blocking=True)
                self.events[k].record(self.stream)

    def table(self, k: int) -> torch.Tensor:
        """In the step: layer k's staged records (the current stream waits for their copy)."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_event(self.events[k])
        return self.tables[k]

    def join(self) -> None:
        """In the step: the current stream waits for every copy (a captured step rejoins its side stream)."""
        if self.stream is not None:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)

    def prefetch(self, ids: np.ndarray) -> None:
        """Start reading the records of global ids [n, layers, cols] a later step needs."""
        for k, src in self.sources.items():
            src.prefetch(np.unique(ids[:, k]) - self.row_lo[k])
