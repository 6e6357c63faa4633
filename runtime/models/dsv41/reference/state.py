"""Per-sequence decoding state of the DeepSeek-V4.1 forward: window rings, compressor buffers, compressed entries.

What a layer keeps, by mode (spec/deepseek_v41.md section 2):
  every layer            a sliding-window ring of its FP8-quantised, rotated K=V latents (slot = position % window)
  full (KV source)       + the compressor's pending rows (the tokens of a group not yet complete), the
                           compressed entries (rotated, FP4-quantised) and, when it is an index source too,
                           the indexer keys (one per compressed entry)
  reindex / reuse        nothing more: they read their source's entries through the forward's shared state
Chunked prefill then one-token decode computes exactly what one whole pass computes, because a group's
pending rows and the window carry across calls (reference: HF deepseek_v41 `DeepseekV41CSACache`).

A draft-verify step feeds rows it may take back: `mark(rows)` before that forward keeps what the rows will
overwrite (the ring slots, the compressors' group counts and, through `join`, the rows each group was pooled
from), and `truncate(mark, position)` afterwards leaves exactly the state of a sequence that was only ever fed
up to `position`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class GrowRows:
    """Rows appended over time into a buffer whose capacity doubles (no quadratic re-concatenation)."""

    def __init__(self, width: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self._data = torch.empty(0, width, dtype=dtype, device=device)
        self.count = 0

    def append(self, rows: torch.Tensor) -> None:
        """Add rows [n, width] at the end (stored in the buffer's dtype)."""
        need = self.count + rows.shape[0]
        if need > self._data.shape[0]:
            grown = torch.empty(
                max(need, 2 * self._data.shape[0], 16),
                self._data.shape[1],
                dtype=self._data.dtype,
                device=self._data.device,
            )
            grown[: self.count] = self._data[: self.count]
            self._data = grown
        self._data[self.count : need] = rows.to(self._data.dtype)
        self.count = need

    def view(self) -> torch.Tensor:
        """The rows so far [count, width] (a view: read it before the next append)."""
        return self._data[: self.count]

    def truncate(self, count: int) -> None:
        """Forget every row from `count` on (the next append writes over them)."""
        if not 0 <= count <= self.count:
            raise ValueError(f"cannot truncate {self.count} rows to {count}")
        self.count = count

    @classmethod
    def of(cls, rows: torch.Tensor) -> GrowRows:
        """A buffer holding exactly `rows` [n, width] (not copied)."""
        grown = cls(rows.shape[1], rows.dtype, rows.device)
        grown._data, grown.count = rows, rows.shape[0]
        return grown

    def clone(self, device: torch.device | str | None = None, pin: bool = False) -> GrowRows:
        """A copy of the rows so far on `device` (default: where they are), with no spare capacity."""
        return GrowRows.of(_copy(self.view(), device, pin))


class WindowRing:
    """The last `window` K=V latents of one layer, slot = position % window."""

    def __init__(self, window: int, width: int, dtype: torch.dtype, device: torch.device | str) -> None:
        self.window = window
        self.keys = torch.zeros(window, width, dtype=dtype, device=device)

    def before(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, positions) of the cached tokens a chunk starting at `start` can still see."""
        first = max(0, start - (self.window - 1))
        positions = torch.arange(first, start, device=self.keys.device)
        return self.keys[positions % self.window], positions

    @classmethod
    def of(cls, keys: torch.Tensor) -> WindowRing:
        """A ring over `keys` [window, width] (not copied)."""
        ring = cls.__new__(cls)
        ring.window, ring.keys = keys.shape[0], keys
        return ring

    def clone(self, device: torch.device | str | None = None, pin: bool = False) -> WindowRing:
        """A copy of the ring on `device` (default: where it is)."""
        return WindowRing.of(_copy(self.keys, device, pin))

    def write(self, start: int, keys: torch.Tensor) -> None:
        """Store a chunk's latents [n, width] for positions start..start+n-1 (only the last `window` stay)."""
        n = keys.shape[0]
        keep = min(n, self.window)
        positions = torch.arange(start + n - keep, start + n, device=self.keys.device)
        self.keys[positions % self.window] = keys[n - keep :].to(self.keys.dtype)


@dataclass
class CompressorState:
    """A KV source's group buffer and its running compressed entries and indexer keys."""

    ratio: int
    pending_kv: torch.Tensor  # [p < ratio, head_dim] projected rows of the incomplete group
    pending_gate: torch.Tensor | None  # same for the gate (ratio > 1 only)
    entries: GrowRows  # rotated, FP4-quantised compressed KV [groups, head_dim]
    index_keys: GrowRows | None  # rotated, FP4-quantised indexer keys [groups, index_head_dim]
    journal: list[tuple[torch.Tensor, torch.Tensor | None]] | None = None  # rows `join` saw since a mark

    def join(self, kv: torch.Tensor, gate: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The pending rows followed by a chunk's new rows, in the state's dtype (kept while a mark is open)."""
        kv = torch.cat((self.pending_kv, kv.to(self.pending_kv.dtype)))
        if gate is not None:
            gate = torch.cat((self.pending_gate, gate.to(self.pending_gate.dtype)))
        if self.journal is not None:
            self.journal.append((kv, gate))
        return kv, gate

    @property
    def groups(self) -> int:
        """Groups emitted so far; group g covers positions g*ratio .. g*ratio+ratio-1."""
        return self.entries.count

    def clone(self, device: torch.device | str | None = None, pin: bool = False) -> CompressorState:
        """A copy of the buffer and entries on `device` (default: where they are)."""
        gate = None if self.pending_gate is None else _copy(self.pending_gate, device, pin)
        keys = None if self.index_keys is None else self.index_keys.clone(device, pin)
        return CompressorState(
            self.ratio, _copy(self.pending_kv, device, pin), gate, self.entries.clone(device, pin), keys
        )

    def tensors(self) -> list[torch.Tensor]:
        """The tensors it holds (rows so far only)."""
        held = [self.pending_kv, self.entries.view()]
        held += [] if self.pending_gate is None else [self.pending_gate]
        return held + ([] if self.index_keys is None else [self.index_keys.view()])


@dataclass
class Mark:
    """What a forward of `rows` rows from `position` overwrites: enough to cut any of those rows off again."""

    position: int
    rows: int
    rings: dict[int, torch.Tensor]  # layer -> its ring slots of positions position .. position+rows-1, before
    groups: dict[int, int]  # KV-source layer -> groups emitted before


@dataclass
class SequenceState:
    """Everything one sequence carries between forward calls."""

    position: int = 0  # tokens already processed = position of the next token
    windows: dict[int, WindowRing] = field(default_factory=dict)
    compressors: dict[int, CompressorState] = field(default_factory=dict)
    tokens: list[int] = field(default_factory=list)  # token ids so far (Engram look-back, generation)

    def clone(self, device: torch.device | str | None = None, pin: bool = False) -> SequenceState:
        """A deep copy on `device` (default: where each tensor is; `pin`: page-locked host memory)."""
        return SequenceState(
            self.position,
            {layer: ring.clone(device, pin) for layer, ring in self.windows.items()},
            {layer: c.clone(device, pin) for layer, c in self.compressors.items()},
            list(self.tokens),
        )

    def mark(self, rows: int) -> Mark:
        """Keep what the next forward of `rows` rows will overwrite (a state that has run once, rows <= window)."""
        if self.position == 0 or not self.windows:
            raise ValueError("a mark needs a state that has run at least one forward")
        saved = {}
        for layer, ring in self.windows.items():
            if rows > ring.window:
                raise ValueError(f"{rows} rows to take back exceed the {ring.window}-slot window")
            saved[layer] = ring.keys[_slots(self.position, rows, ring)].clone()
        for c in self.compressors.values():
            c.journal = []
        groups = {layer: c.groups for layer, c in self.compressors.items()}
        return Mark(self.position, rows, saved, groups)

    def truncate(self, mark: Mark, position: int) -> None:
        """Cut the rows the marked forward fed from `position` on; close the mark (position at its end: keep all)."""
        keep = position - mark.position
        if self.position != mark.position + mark.rows or not 0 <= keep <= mark.rows:
            raise ValueError(
                f"a state at {self.position} marked at {mark.position} for {mark.rows} rows cannot go to {position}"
            )
        for layer, ring in self.windows.items():
            ring.keys[_slots(mark.position, mark.rows, ring)[keep:]] = mark.rings[layer][keep:]
        for layer, c in self.compressors.items():
            journal, c.journal = c.journal, None
            if keep == mark.rows:
                continue
            if journal is None or len(journal) != 1:
                raise ValueError(
                    f"layer {layer}: the marked forward fed its compressor {len(journal or ())} times"
                )
            kv, gate = journal[0]
            rows = kv.shape[0] - mark.rows + keep  # pending at the mark, then the rows kept
            whole = rows // c.ratio
            c.entries.truncate(mark.groups[layer] + whole)
            if c.index_keys is not None:
                c.index_keys.truncate(mark.groups[layer] + whole)
            c.pending_kv = kv[whole * c.ratio : rows].clone()
            if gate is not None:
                c.pending_gate = gate[whole * c.ratio : rows].clone()
        del self.tokens[position:]
        self.position = position

    @property
    def nbytes(self) -> int:
        """Bytes of its tensors (rows in use) and token ids (8 each)."""
        held = [ring.keys for ring in self.windows.values()]
        held += [t for c in self.compressors.values() for t in c.tensors()]
        return sum(t.numel() * t.element_size() for t in held) + 8 * len(self.tokens)


def _slots(position: int, rows: int, ring: WindowRing) -> torch.Tensor:
    """A ring's slots of positions position .. position+rows-1."""
    return torch.arange(position, position + rows, device=ring.keys.device) % ring.window


def _copy(t: torch.Tensor, device: torch.device | str | None, pin: bool) -> torch.Tensor:
    """A copy of `t` on `device` (default: its own), in page-locked memory when `pin` and on the host."""
    out = t.to(device or t.device, copy=True)
    return out.pin_memory() if pin and out.device.type == "cpu" else out


def new_compressor(
    ratio: int, head_dim: int, index_dim: int | None, dtype: torch.dtype, device: torch.device | str
) -> CompressorState:
    """An empty compressor state for one KV-source layer."""
    return CompressorState(
        ratio=ratio,
        pending_kv=torch.empty(0, head_dim, dtype=dtype, device=device),
        pending_gate=torch.empty(0, head_dim, dtype=dtype, device=device) if ratio > 1 else None,
        entries=GrowRows(head_dim, dtype, device),
        index_keys=None if index_dim is None else GrowRows(index_dim, dtype, device),
    )
