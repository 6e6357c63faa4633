"""The worker's KV memory on the device: allocated once at start, paged, never moved.

Buffers (uint8 rows in the kv_rows formats unless said; slot index `slots` is the dummy slot padding rows use):
  window      [layers, slots + 1, ring, window row]       FP8 window ring of every layer, row = position % ring
  entries[l]  [(pages + 1) * page_tokens / r, entry row]   compressed entries of KV source l (page 0 scratch)
  keys[l]     [(pages + 1) * page_tokens / r, key row]     its indexer keys, same addressing
  pending[l]  [2, slots + 1, compressor ring, head_dim]    fp32 projected kv / gate rows (ratio > 1), row = position % ring
  page_table  [slots + 1, bucket pages] int64                the host table's device copy (0 = scratch page)
All are views of one uint8 allocation (`base`, each at a BASE_ALIGN-byte offset named in `offsets`).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from tfc.runtime.models.dsv41.fast.kv.layout import KvLayout
from tfc.runtime.models.dsv41.fast.kv.pages import PagePool

BASE_ALIGN = 256  # bytes: each buffer's offset in the one allocation (every dtype's alignment)


class HostStage:
    """Small int64 uploads (page-table rows, row ids) the host does not wait for: a page-locked buffer and its
    device twin, kept; an upload waits only for the previous copy out of the same buffer, and a later one
    overwrites the device twin only after, in stream order, what read it."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._host: torch.Tensor | None = None
        self._host_np: np.ndarray | None = None  # the page-locked buffer as numpy, for the copy in
        self._dev: torch.Tensor | None = None
        self._copied = torch.cuda.Event() if device.type == "cuda" else None

    def send(self, values: np.ndarray) -> torch.Tensor:
        """`values` on the device (a view of the twin on a GPU, valid until the next send)."""
        values = np.asarray(values, dtype=np.int64)
        if self._copied is None:
            return torch.from_numpy(values.copy()).to(self.device)
        n = len(values)
        if self._host is not None:
            self._copied.synchronize()
        if self._host is None or self._host.numel() < n:
            size = max(n, 4096, 2 * (0 if self._host is None else self._host.numel()))
            self._host = torch.empty(size, dtype=torch.int64, pin_memory=True)
            self._host_np = self._host.numpy()
            self._dev = torch.empty(size, dtype=torch.int64, device=self.device)
        self._host_np[:n] = values
        out = self._dev[:n]
        out.copy_(self._host[:n], non_blocking=True)
        self._copied.record(torch.cuda.current_stream(self.device))  # the copy's stream, any device current
        return out


class KvMemory:
    """Device buffers of a KV layout for `slots` slots and a pool of `tokens` tokens (whole pages)."""

    def __init__(self, layout: KvLayout, slots: int, tokens: int, tokens_per_slot: int, table_tokens: int,
                 device: torch.device) -> None:  # fmt: skip
        self.layout = layout
        self.slots = slots
        self.device = device
        pages = max(1, -(-tokens // layout.page_tokens))
        self.pool = PagePool(pages, layout.page_tokens, slots, tokens_per_slot)
        u8, f32 = torch.uint8, torch.float32
        # Wide enough for the largest context bucket a step scores (columns past a slot's limit stay scratch).
        width = max(self.pool.max_pages, -(-table_tokens // layout.page_tokens))
        plan: list[tuple[str, tuple[int, ...], torch.dtype]] = [
            ("window", (layout.layers, slots + 1, layout.ring, layout.window_row.nbytes), u8),
            ("page_table", (slots + 1, width), torch.int64),
        ]
        for s in layout.sources:
            rows = (pages + 1) * layout.entries_per_page(s.ratio)
            plan.append((f"entries.{s.layer}", (rows, layout.entry_row.nbytes), u8))
            if s.index_keys:
                plan.append((f"keys.{s.layer}", (rows, layout.key_row.nbytes), u8))
            if s.ratio > 1:
                ring = layout.compressor_ring(s.ratio)
                plan.append((f"pending.{s.layer}", (2, slots + 1, ring, layout.head_dim), f32))
        # One allocation, every buffer a view of it at a BASE_ALIGN-byte offset: a restore writes them all in one
        # launch (kernels/run_copy.py), addressed as words of `base`.
        at, self.offsets = 0, {}  # name -> byte offset in base
        for name, shape, dtype in plan:
            self.offsets[name] = at
            at += -(-math.prod(shape) * dtype.itemsize // BASE_ALIGN) * BASE_ALIGN
        self.base = torch.zeros(at, dtype=u8, device=device)
        self.words = {4: self.base.view(torch.int32), 2: self.base.view(torch.int16), 1: self.base}
        self.entries: dict[int, torch.Tensor] = {}
        self.keys: dict[int, torch.Tensor] = {}
        self.pending: dict[int, torch.Tensor] = {}
        for name, shape, dtype in plan:
            off = self.offsets[name]
            view = self.base[off : off + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
            kind, _, layer = name.partition(".")
            if layer:
                getattr(self, kind)[int(layer)] = view
            else:
                setattr(self, kind, view)
        # Page-table rows and row ids go up through two kept buffers, so neither waits on the other's copy.
        self.table_stage = HostStage(device)
        self.row_stage = HostStage(device)
        self.run_plan = None  # kv_snapshot's plan of a restore's runs, made on first use

    @property
    def dummy_slot(self) -> int:
        """The slot padding rows read and write."""
        return self.slots

    @property
    def tensors(self) -> list[torch.Tensor]:
        """Every buffer (what a graph bakes in)."""
        return [
            self.window,
            *self.entries.values(),
            *self.keys.values(),
            *self.pending.values(),
            self.page_table,
        ]

    @property
    def nbytes(self) -> int:
        """Bytes allocated."""
        return sum(t.numel() * t.element_size() for t in self.tensors)

    def remap(self, slot: int, tokens: int) -> np.ndarray:
        """Give the slot fresh pages for its first `tokens` tokens, on the host only: its whole page-table row
        (scratch past its pages), for the caller to send up (KvFull when the pool cannot)."""
        self.pool.release(slot)
        self.pool.ensure(slot, tokens)
        row = np.zeros(self.page_table.shape[1], dtype=np.int64)
        table = self.pool.table(slot)
        row[: len(table)] = table
        return row

    def ensure(self, slot: int, tokens: int) -> None:
        """Map pages for the slot's first `tokens` tokens; the device table row follows the host's."""
        if self.pool.ensure(slot, tokens):
            table = self.pool.table(slot)
            self.page_table[slot, : len(table)].copy_(self.table_stage.send(table))

    def truncate(self, slot: int, tokens: int) -> None:
        """Unmap the slot's pages past its first `tokens` tokens (their table entries back to the scratch page)."""
        if self.pool.truncate(slot, tokens):
            self.page_table[slot, len(self.pool.table(slot)) :].zero_()

    def release(self, slot: int) -> None:
        """Free the slot's pages and point its table at the scratch page (its rows stay where they are)."""
        if self.pool.table(slot):
            self.pool.release(slot)
            self.page_table[slot].zero_()
