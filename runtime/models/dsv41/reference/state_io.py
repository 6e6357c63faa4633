"""Snapshots of a sequence's state for the engine's prefix cache: a self-contained copy, its host copy, its bytes.

The byte form (runtime/models/snapshot_bytes.py, strict on the way back in), magic b"TFCSEQ1\\n":
  header: {"position": P, "ratios": {layer: ratio}, "tensors": [...]}, the tensors in this order:
    tokens (int64 [P]), window.L [window, width], pending_kv.L, pending_gate.L (ratio > 1), entries.L,
    index_keys.L (an index source only) — every tensor but tokens is 2-D.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from tfc.runtime.models.dsv41.reference.state import CompressorState, GrowRows, SequenceState, WindowRing
from tfc.runtime.models.snapshot_bytes import pack, unpack

from tfc.errors import TfcError

MAGIC = b"TFCSEQ1\n"
_NAME = re.compile(r"(tokens)|(window|pending_kv|pending_gate|entries|index_keys)\.(\d{1,4})")


class StateFormatError(TfcError):
    """Bytes that are not a sequence state this code wrote."""


@dataclass(frozen=True)
class StateSnapshot:
    """A self-contained copy of one sequence's state at its position: what the prefix cache keeps."""

    state: SequenceState
    nbytes: int

    @classmethod
    def of(cls, state: SequenceState) -> StateSnapshot:
        """A snapshot holding `state` (the caller hands over a copy nobody else writes)."""
        return cls(state, state.nbytes)

    def to_host(self) -> StateSnapshot:
        """The same state in host memory (page-locked when it was on a GPU)."""
        on_gpu = any(r.keys.device.type != "cpu" for r in self.state.windows.values())
        return StateSnapshot(self.state.clone("cpu", pin=on_gpu), self.nbytes)

    def to_bytes(self) -> bytes:
        """The byte form (module docstring)."""
        return state_to_bytes(self.state)


def _tensors(state: SequenceState) -> list[tuple[str, torch.Tensor]]:
    named = [("tokens", torch.tensor(state.tokens, dtype=torch.int64))]
    named += [(f"window.{layer}", ring.keys) for layer, ring in sorted(state.windows.items())]
    for layer, c in sorted(state.compressors.items()):
        named.append((f"pending_kv.{layer}", c.pending_kv))
        if c.pending_gate is not None:
            named.append((f"pending_gate.{layer}", c.pending_gate))
        named.append((f"entries.{layer}", c.entries.view()))
        if c.index_keys is not None:
            named.append((f"index_keys.{layer}", c.index_keys.view()))
    return named


def state_to_bytes(state: SequenceState) -> bytes:
    """A sequence state as bytes (module docstring)."""
    ratios = {str(layer): c.ratio for layer, c in state.compressors.items()}
    return pack(MAGIC, {"position": state.position, "ratios": ratios}, _tensors(state), StateFormatError)


def state_from_bytes(data: bytes) -> SequenceState:
    """The sequence state `state_to_bytes` wrote, in host memory; StateFormatError for anything else."""
    header, tensors = unpack(MAGIC, data, _dims, StateFormatError)
    position, ratios = _fields(header)
    return _assemble(position, ratios, tensors)


def _dims(name: str) -> int | None:
    if not _NAME.fullmatch(name):
        return None
    return 1 if name == "tokens" else 2


def _fields(header: dict) -> tuple[int, dict[int, int]]:
    position, ratios = header.get("position"), header.get("ratios")
    if type(position) is not int or position < 0:
        raise StateFormatError(f"bad position {position!r}")
    if not isinstance(ratios, dict):
        raise StateFormatError("the header lacks its ratios")
    out = {}
    for layer, ratio in ratios.items():
        if not layer.isdigit() or type(ratio) is not int or not 1 <= ratio <= 1024:
            raise StateFormatError(f"bad compress ratio {ratio!r} for layer {layer!r}")
        out[int(layer)] = ratio
    return position, out


def _assemble(position: int, ratios: dict[int, int], tensors: dict[str, torch.Tensor]) -> SequenceState:
    tokens = tensors.pop("tokens", None)
    if tokens is None or tokens.dtype != torch.int64 or tokens.numel() != position:
        raise StateFormatError(f"the token ids do not cover the {position} positions")
    state = SequenceState(position=position, tokens=tokens.tolist())
    for name in sorted(n for n in tensors if n.startswith("window.")):
        keys = tensors.pop(name)
        if keys.shape[0] == 0:
            raise StateFormatError(f"{name}: an empty window")
        state.windows[int(name.split(".")[1])] = WindowRing.of(keys)
    for layer, ratio in ratios.items():
        kv, entries = tensors.pop(f"pending_kv.{layer}", None), tensors.pop(f"entries.{layer}", None)
        gate, keys = tensors.pop(f"pending_gate.{layer}", None), tensors.pop(f"index_keys.{layer}", None)
        if kv is None or entries is None or (gate is None) != (ratio == 1):
            raise StateFormatError(f"layer {layer}: the compressor's tensors are incomplete")
        if (
            kv.shape[0] != position % ratio
            or kv.shape[1] != entries.shape[1]
            or (gate is not None and gate.shape != kv.shape)
        ):
            raise StateFormatError(f"layer {layer}: pending rows {tuple(kv.shape)} do not fit ratio {ratio}")
        if entries.shape[0] != position // ratio or (keys is not None and keys.shape[0] != entries.shape[0]):
            raise StateFormatError(f"layer {layer}: {entries.shape[0]} entries for {position} positions")
        index = None if keys is None else GrowRows.of(keys)
        state.compressors[layer] = CompressorState(ratio, kv, gate, GrowRows.of(entries), index)
    if tensors:
        raise StateFormatError(f"tensors of no compressor: {sorted(tensors)}")
    return state


__all__ = ["StateFormatError", "StateSnapshot", "state_from_bytes", "state_to_bytes"]
