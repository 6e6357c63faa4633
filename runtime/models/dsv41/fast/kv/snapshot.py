"""Snapshots of one fast-runner slot for the prefix cache: its KV rows copied out of the shared buffers and back.

A slot's state is its window rings (every layer's `ring` rows, whatever positions they hold: reads mask by
position), each ratio > 1 source's compressor ring, the compressed entries and indexer keys of its complete
groups (gathered from its pages), its position and the tokens it was fed (the Engram look-back is their tail,
the drafter's context their count). A snapshot copies them out into one packed buffer (on the device, ~1.8 KB a
token of paged rows plus ~3.4 MB of rings at Flash size; its host copy is one transfer), `restore` maps fresh pages
for the position and writes the buffer back in one launch of runs (kernels/run_copy.py): nothing in the KV
buffers moves, so graphs stay valid. Byte form: magic
b"TFCKV2\\n" (runtime/models/snapshot_bytes.py), header {"position", "tokens", "ring"}, tensors
window [layers, ring, row], pending.L [2, ring_L, head_dim] fp32, entries.L / keys.L [groups, row].
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import torch
from tfc.kernels.run_copy import copy_runs
from tfc.runtime.models.dsv41.fast.kv.memory import KvMemory
from tfc.runtime.models.snapshot_bytes import pack, unpack

from tfc.errors import TfcError

MAGIC = b"TFCKV2\n"  # 2: every fed token, not only the Engram look-back
ALIGN = 64  # bytes: each tensor's offset in a packed host copy
_NAME = re.compile(r"window|(pending|entries|keys)\.(\d{1,4})")
Spec = tuple[tuple[int, ...], torch.dtype]


class KvSnapshotError(TfcError):
    """Bytes that are not a fast-runner slot snapshot of this model's KV layout."""


@dataclass(frozen=True)
class KvSnapshot:
    """One slot's KV rows at a position, self-contained (device or host memory)."""

    position: int
    tokens: tuple[int, ...]  # the `position` tokens the slot was fed
    window: torch.Tensor  # [layers, ring, row] uint8
    pending: dict[int, torch.Tensor]  # [2, ring_l, head_dim] fp32
    entries: dict[int, torch.Tensor]  # [position // ratio, row] uint8
    keys: dict[int, torch.Tensor]
    packed: torch.Tensor  # the one uint8 buffer the tensors are views of (device or host)

    @property
    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Every tensor with its byte-form name."""
        named = [("window", self.window)]
        named += [(f"pending.{layer}", t) for layer, t in sorted(self.pending.items())]
        named += [(f"entries.{layer}", t) for layer, t in sorted(self.entries.items())]
        named += [(f"keys.{layer}", t) for layer, t in sorted(self.keys.items())]
        return named

    @property
    def specs(self) -> list[Spec]:
        """Every tensor's (shape, dtype), in `tensors` order (the packed buffer's)."""
        return [(tuple(t.shape), t.dtype) for _, t in self.tensors]

    @property
    def nbytes(self) -> int:
        """Bytes the snapshot holds."""
        return sum(t.numel() * t.element_size() for _, t in self.tensors)

    def to_host(self) -> KvSnapshot:
        """The same rows in host memory (page-locked when they were on a GPU): one transfer of `packed`."""
        pin = self.packed.device.type == "cuda"
        host = torch.empty(self.packed.numel(), dtype=torch.uint8, pin_memory=pin)
        host.copy_(self.packed)
        return self.on(host)

    def on(self, packed: torch.Tensor) -> KvSnapshot:
        """This snapshot over another buffer holding the same bytes (its tensors views of it)."""
        names = [n for n, _ in self.tensors]
        return _parts(self.position, self.tokens, names, _views(packed, self.specs), packed)

    def to_bytes(self) -> bytes:
        """The byte form (module docstring)."""
        fields = {"position": self.position, "tokens": list(self.tokens), "ring": self.window.shape[1]}
        return pack(MAGIC, fields, self.tensors, KvSnapshotError)


def _offsets(specs: list[Spec]) -> tuple[list[int], int]:
    """(Each tensor's byte offset in one packed buffer, at ALIGN-byte steps; the buffer's bytes)."""
    out, at = [], 0
    for shape, dtype in specs:
        out.append(at)
        at += -(-math.prod(shape) * dtype.itemsize // ALIGN) * ALIGN
    return out, at


def _views(buf: torch.Tensor, specs: list[Spec]) -> list[torch.Tensor]:
    """Views of a packed uint8 buffer with each (shape, dtype), at the offsets _offsets gives."""
    offsets, _ = _offsets(specs)
    return [buf[at : at + math.prod(shape) * dtype.itemsize].view(dtype).view(shape)
            for at, (shape, dtype) in zip(offsets, specs, strict=True)]  # fmt: skip


def _packed(
    named: list[tuple[str, Spec]], device: torch.device, pin: bool = False
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(A new packed buffer for tensors of these (shape, dtype), its views in order)."""
    specs = [spec for _, spec in named]
    buf = torch.empty(_offsets(specs)[1], dtype=torch.uint8, device=device, pin_memory=pin)
    return buf, _views(buf, specs)


def entry_rows(kv: KvMemory, slot: int, ratio: int, groups: int) -> torch.Tensor:
    """Row ids (in the entry / key buffers) of a slot's first `groups` entries of a ratio-`ratio` source."""
    return _rows(kv, slot, [(ratio, groups)])[0].clone()  # its own: the kept buffer is rewritten by the next


def _source_rows(kv: KvMemory, slot: int, position: int) -> tuple[torch.Tensor, ...]:
    """entry_rows of every source at `position`, valid until the KV memory's next row upload."""
    return _rows(kv, slot, [(s.ratio, position // s.ratio) for s in kv.layout.sources])


def _rows(kv: KvMemory, slot: int, wanted: list[tuple[int, int]]) -> tuple[torch.Tensor, ...]:
    """For each (ratio, groups): the buffer rows of the slot's first `groups` entries, computed on the host from
    its page table and sent up in one copy."""
    pages = np.asarray(kv.pool.table(slot), dtype=np.int64)
    host = []
    for ratio, groups in wanted:
        per, e = kv.layout.entries_per_page(ratio), np.arange(groups, dtype=np.int64)
        host.append(pages[e // per] * per + e % per)
    return kv.row_stage.send(np.concatenate(host)).split([len(r) for r in host])


def _named_specs(kv: KvMemory, position: int) -> list[tuple[str, Spec]]:
    """The byte form's tensors of a snapshot at `position`, in packed order: name, (shape, dtype)."""
    lay = kv.layout
    named: list[tuple[str, Spec]] = [("window", (tuple(kv.window[:, 0].shape), torch.uint8))]
    named += [
        (f"pending.{layer}", (tuple(t[:, 0].shape), t.dtype)) for layer, t in sorted(kv.pending.items())
    ]
    named += [(f"entries.{s.layer}", ((position // s.ratio, lay.entry_row.nbytes), torch.uint8))
              for s in sorted(lay.sources, key=lambda s: s.layer)]  # fmt: skip
    named += [(f"keys.{s.layer}", ((position // s.ratio, lay.key_row.nbytes), torch.uint8))
              for s in sorted(lay.sources, key=lambda s: s.layer) if s.index_keys]  # fmt: skip
    return named


def _parts(position: int, tokens: tuple[int, ...], named: list[str], views: list[torch.Tensor],
           packed: torch.Tensor) -> KvSnapshot:  # fmt: skip
    """A snapshot of views named by the byte form's names."""
    by = dict(zip(named, views, strict=True))
    pick = {kind: {int(n.split(".")[1]): t for n, t in by.items() if n.startswith(kind + ".")}
            for kind in ("pending", "entries", "keys")}  # fmt: skip
    return KvSnapshot(position, tokens, by["window"], pick["pending"], pick["entries"], pick["keys"], packed)


def snapshot(kv: KvMemory, slot: int, tokens: tuple[int, ...]) -> KvSnapshot:
    """A copy of a slot's KV rows after its `tokens`, packed on the device (the slot keeps running unchanged)."""
    position = len(tokens)
    named = _named_specs(kv, position)
    packed, views = _packed(named, kv.device)
    snap = _parts(position, tuple(tokens), [n for n, _ in named], views, packed)
    snap.window.copy_(kv.window[:, slot])
    for layer, t in snap.pending.items():
        t.copy_(kv.pending[layer][:, slot])
    for s, rows in zip(kv.layout.sources, _source_rows(kv, slot, position), strict=True):
        torch.index_select(kv.entries[s.layer], 0, rows, out=snap.entries[s.layer])
        if s.index_keys:
            torch.index_select(kv.keys[s.layer], 0, rows, out=snap.keys[s.layer])
    return snap


def restore(kv: KvMemory, slot: int, snap: KvSnapshot) -> None:
    """Map fresh pages for the snapshot's position in a released slot and write its rows back. The packed buffer
    goes up in one transfer (when on the host), started first so that the host's work overlaps it; the runs
    (runs_of: a fixed number, whatever the position) and the slot's page-table row follow in one upload through the
    KV memory's kept page-locked buffer; one launch copies every run, the table row among them, and places the
    entries and keys in the slot's pages from that row. The host waits for nothing but that buffer's previous copy."""
    staged = snap.packed.to(kv.device, non_blocking=True)
    row = kv.remap(slot, max(1, snap.position))
    runs = runs_of(kv, slot, snap.position)
    n = runs.shape[1]
    after_runs = 4 * (n + 1) * 8  # the upload is the runs (this one too), int64, then the row
    table = np.array(
        [[after_runs], [kv.offsets["page_table"] + slot * row.nbytes], [row.nbytes], [0]], np.int64
    )
    runs = np.concatenate([runs, table], axis=1)
    word = _word(runs)
    runs //= word
    up = kv.row_stage.send(np.concatenate([runs.reshape(-1), row]))
    words = {4: torch.int32, 2: torch.int16, 1: torch.uint8}[word]
    copy_runs(staged.view(words), kv.words[word], up[: 4 * (n + 1)].view(4, n + 1), int(runs[2].max()),
              aux=up.view(words), n_main=n, pages=up[4 * (n + 1) :])  # fmt: skip


def runs_of(kv: KvMemory, slot: int, position: int) -> np.ndarray:
    """int64 [4, n] byte runs (offset in the packed buffer, offset in the KV base, bytes, page stride or 0)
    writing a snapshot at `position` into `slot`: a run per layer's window ring and per pending half, and one paged
    run per source's entries and keys (its page c at the buffer's offset + page id · page stride, the page ids the
    slot's page-table row): as many runs at every position."""
    plan = _run_plan(kv)
    fixed = plan.fixed.copy()
    fixed[1] += slot * plan.slot_stride
    at, paged = plan.first_paged, []
    for ratio, width, per, dst in plan.paged:  # in the packed buffer's order (_named_specs)
        size = position // ratio * width
        paged.append((at, dst, size, per * width))
        at += -(-size // ALIGN) * ALIGN
    return np.concatenate([fixed, np.asarray(paged, np.int64).reshape(-1, 4).T], axis=1)


@dataclass(frozen=True)
class _RunPlan:
    """What runs_of needs of one KV memory, made once (kv.run_plan)."""

    fixed: np.ndarray  # [4, f] slot 0's window-ring and pending-half runs (page stride 0)
    slot_stride: np.ndarray  # [f] bytes from one slot's rows of each fixed run to the next slot's
    first_paged: int  # the packed buffer's offset after the rings: where the first entries start
    paged: tuple[tuple[int, int, int, int], ...]  # per entries / keys tensor, packed order: ratio, row bytes,
    # entries a page, offset in the KV base


def _run_plan(kv: KvMemory) -> _RunPlan:
    """The KV memory's _RunPlan (made on first use)."""
    if kv.run_plan is not None:
        return kv.run_plan
    lay, per_slot = kv.layout, kv.slots + 1
    named = _named_specs(kv, 0)
    offsets, _ = _offsets([spec for _, spec in named])
    packed = dict(zip([n for n, _ in named], offsets, strict=True))
    src, dst, size = [], [], []
    ring = lay.ring * lay.window_row.nbytes
    for layer in range(lay.layers):
        src.append(packed["window"] + layer * ring)
        dst.append(kv.offsets["window"] + layer * per_slot * ring)
        size.append(ring)
    for name, t in sorted(kv.pending.items()):
        half = t[0, 0].numel() * t.element_size()
        for j in range(2):
            src.append(packed[f"pending.{name}"] + j * half)
            dst.append(kv.offsets[f"pending.{name}"] + j * per_slot * half)
            size.append(half)
    by_layer = {s.layer: s for s in lay.sources}
    paged = []
    for name, _ in named:
        kind, _, layer = name.partition(".")
        if kind in ("entries", "keys"):
            s = by_layer[int(layer)]
            width = (lay.entry_row if kind == "entries" else lay.key_row).nbytes
            paged.append((s.ratio, width, lay.entries_per_page(s.ratio), kv.offsets[name]))
    first = offsets[len(named) - len(paged)] if paged else 0  # entries and keys come last
    zeros = [0] * len(size)
    kv.run_plan = _RunPlan(
        np.array([src, dst, size, zeros], np.int64), np.array(size, np.int64), first, tuple(paged)
    )
    return kv.run_plan


def _word(runs: np.ndarray) -> int:
    """The widest word (4, 2 or 1 bytes) every offset and size of the runs is a multiple of."""
    g = int(np.gcd.reduce(runs.reshape(-1), initial=4))
    return 4 if g % 4 == 0 else 2 if g % 2 == 0 else 1


def _dims(name: str) -> int | None:
    if not _NAME.fullmatch(name):
        return None
    return 3 if name == "window" or name.startswith("pending.") else 2


def load(kv: KvMemory, data: bytes) -> KvSnapshot:
    """The snapshot `KvSnapshot.to_bytes` wrote, checked against this KV layout; KvSnapshotError otherwise."""
    header, tensors = unpack(MAGIC, data, _dims, KvSnapshotError)
    position, tokens = header.get("position"), header.get("tokens")
    if type(position) is not int or not 0 <= position <= kv.pool.tokens_per_slot:
        raise KvSnapshotError(f"bad position {position!r}")
    ids = isinstance(tokens, list) and all(type(t) is int and t >= 0 for t in tokens)
    if not ids or len(tokens) != position:
        raise KvSnapshotError("bad tokens: not the position's count of token ids")
    named = _named_specs(kv, position)
    got = {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}
    if got != dict(named):
        raise KvSnapshotError(
            f"tensors {sorted(got)} do not fit this model's KV layout at position {position}"
        )
    packed, views = _packed(named, torch.device("cpu"), pin=kv.device.type == "cuda")
    for (name, _), view in zip(named, views, strict=True):
        view.copy_(tensors[name])
    return _parts(position, tuple(tokens), [n for n, _ in named], views, packed)
