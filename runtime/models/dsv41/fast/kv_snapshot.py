"""Snapshots of one fast-runner slot for the prefix cache: its KV rows copied out of the shared buffers and back.

A slot's state is its window rings (every layer's `ring` rows, whatever positions they hold: reads mask by
position), each ratio > 1 source's compressor ring, the compressed entries and indexer keys of its complete
groups (gathered from its pages), its position and the tokens it was fed (the Engram look-back is their tail,
the drafter's context their count). A snapshot copies them out (a device copy
on the GPU: ~1.8 KB a token of paged rows plus ~3.4 MB of rings at Flash size), `restore` maps fresh pages for
the position and writes them back: nothing in the buffers moves, so graphs stay valid. Byte form: magic
b"TFCKV2\\n" (runtime/models/snapshot_bytes.py), header {"position", "tokens", "ring"}, tensors
window [layers, ring, row], pending.L [2, ring_L, head_dim] fp32, entries.L / keys.L [groups, row].
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
from tfc.runtime.models.dsv41.fast.kv_memory import KvMemory
from tfc.runtime.models.snapshot_bytes import pack, unpack

from tfc.errors import TfcError

MAGIC = b"TFCKV2\n"  # 2: every fed token, not only the Engram look-back
ALIGN = 64  # bytes: each tensor's offset in a packed host copy
_NAME = re.compile(r"window|(pending|entries|keys)\.(\d{1,4})")


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
    packed: torch.Tensor | None = None  # to_host's one buffer the tensors are views of

    @property
    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Every tensor with its byte-form name."""
        named = [("window", self.window)]
        named += [(f"pending.{layer}", t) for layer, t in sorted(self.pending.items())]
        named += [(f"entries.{layer}", t) for layer, t in sorted(self.entries.items())]
        named += [(f"keys.{layer}", t) for layer, t in sorted(self.keys.items())]
        return named

    @property
    def nbytes(self) -> int:
        """Bytes the snapshot holds."""
        return sum(t.numel() * t.element_size() for _, t in self.tensors)

    def to_host(self) -> KvSnapshot:
        """The same rows in host memory, in one buffer (page-locked when they were on a GPU) that `restore` sends
        up in one transfer: the tensors are views of `packed`."""
        named = self.tensors
        pin = self.window.device.type == "cuda"
        packed = torch.empty(_packed_bytes(named), dtype=torch.uint8, pin_memory=pin)
        views = _views(packed, named)
        for view, (_, t) in zip(views, named, strict=True):
            view.copy_(t)
        return self._with(views, packed)

    def _with(self, tensors: list[torch.Tensor], packed: torch.Tensor | None) -> KvSnapshot:
        """This snapshot with its tensors replaced (in `tensors` order)."""
        it = iter(tensors)
        window = next(it)
        parts = [{layer: next(it) for layer in sorted(d)} for d in (self.pending, self.entries, self.keys)]
        return KvSnapshot(self.position, self.tokens, window, *parts, packed=packed)

    def to_bytes(self) -> bytes:
        """The byte form (module docstring)."""
        fields = {"position": self.position, "tokens": list(self.tokens), "ring": self.window.shape[1]}
        return pack(MAGIC, fields, self.tensors, KvSnapshotError)


def _packed_bytes(named: list[tuple[str, torch.Tensor]]) -> int:
    """Bytes of one buffer holding every tensor at ALIGN-byte offsets."""
    return sum(-(-t.numel() * t.element_size() // ALIGN) * ALIGN for _, t in named)


def _views(buf: torch.Tensor, named: list[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
    """Views of a uint8 buffer shaped and typed like each tensor, at the offsets _packed_bytes counts."""
    out, at = [], 0
    for _, t in named:
        n = t.numel() * t.element_size()
        out.append(buf[at : at + n].view(t.dtype).view(t.shape))
        at += -(-n // ALIGN) * ALIGN
    return out


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


def snapshot(kv: KvMemory, slot: int, tokens: tuple[int, ...]) -> KvSnapshot:
    """A copy of a slot's KV rows after its `tokens` (the slot keeps running unchanged)."""
    position = len(tokens)
    entries, keys = {}, {}
    for s, rows in zip(kv.layout.sources, _source_rows(kv, slot, position), strict=True):
        entries[s.layer] = kv.entries[s.layer][rows]
        if s.index_keys:
            keys[s.layer] = kv.keys[s.layer][rows]
    pending = {layer: t[:, slot].clone() for layer, t in kv.pending.items()}
    return KvSnapshot(position, tuple(tokens), kv.window[:, slot].clone(), pending, entries, keys)


def restore(kv: KvMemory, slot: int, snap: KvSnapshot) -> None:
    """Map pages for the snapshot's position in a (released) slot and write its rows back: a packed host copy
    goes up in one transfer, started first so that the host's page work overlaps it; the page table and every
    source's row ids (computed on the host) follow through the KV memory's kept page-locked buffers, then one
    copy per tensor. The host waits for nothing but each kept buffer's previous copy out."""
    if snap.packed is not None:
        staged = snap.packed.to(kv.device, non_blocking=True)
        snap = snap._with(_views(staged, snap.tensors), None)
    kv.release(slot)
    kv.ensure(slot, max(1, snap.position))
    kv.window[:, slot].copy_(snap.window)
    for layer, t in snap.pending.items():
        kv.pending[layer][:, slot].copy_(t)
    for s, at in zip(kv.layout.sources, _source_rows(kv, slot, snap.position), strict=True):
        kv.entries[s.layer].index_copy_(0, at, snap.entries[s.layer].to(kv.device))
        if s.index_keys:
            kv.keys[s.layer].index_copy_(0, at, snap.keys[s.layer].to(kv.device))


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
    want = {"window": (tuple(kv.window[:, 0].shape), torch.uint8)}
    for layer, t in kv.pending.items():
        want[f"pending.{layer}"] = (tuple(t[:, 0].shape), t.dtype)
    for s in kv.layout.sources:
        width = kv.layout.entry_row.nbytes
        want[f"entries.{s.layer}"] = ((position // s.ratio, width), torch.uint8)
        if s.index_keys:
            want[f"keys.{s.layer}"] = ((position // s.ratio, kv.layout.key_row.nbytes), torch.uint8)
    got = {name: (tuple(t.shape), t.dtype) for name, t in tensors.items()}
    if got != want:
        raise KvSnapshotError(
            f"tensors {sorted(got)} do not fit this model's KV layout at position {position}"
        )
    pick = {kind: {int(n.split(".")[1]): t for n, t in tensors.items() if n.startswith(kind + ".")}
            for kind in ("pending", "entries", "keys")}  # fmt: skip
    return KvSnapshot(
        position, tuple(tokens), tensors["window"], pick["pending"], pick["entries"], pick["keys"]
    )
