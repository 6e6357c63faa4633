"""Checks only: the reference forward's weights decoded on the device from the same arena views the fast forward reads.

`DeviceDense` is the mapping `Dsv41Model` takes (pack name -> dense [in, out]): natives are the arena's views,
EXL3 groups and expert-table entries are decoded on first use with the kernels' Triton dense decode
(kernels/exl3_decode.py, itself tested against the numpy reference). It lets a GPU check the fast forward
against the reference at Flash geometry, where the numpy decode would take minutes; nothing serves from it.
`reference_layers` / `fast_layers` run one sequence through either forward keeping every layer's streams.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import torch
from tfc.runtime.models.dsv41.fast.weights import FastWeights

_EXPERT = re.compile(r"^(?P<block>.+)\.ffn\.(?:experts\.(?P<e>\d+)|shared_experts)\.(?P<p>w[123])$")


class DeviceDense(Mapping):
    """Pack name -> dense fp32 weight on the arena's device, decoded lazily (natives: the views as stored)."""

    def __init__(self, weights: FastWeights) -> None:
        self.weights = weights
        self._held: dict[str, torch.Tensor] = {}

    def __getitem__(self, name: str) -> torch.Tensor:
        held = self._held.get(name)
        if held is None:
            held = self._held[name] = self._decode(name)
        return held

    def _decode(self, name: str) -> torch.Tensor:
        from tfc.kernels.exl3_decode import exl3_decode

        w = self.weights
        if w.has(f"{name}.trellis"):
            lin = w.linear(name)
            return exl3_decode(lin.trellis, lin.suh, lin.svh, lin.codebook, dtype=torch.float32)
        m = _EXPERT.match(name)
        if m is not None and w.has(f"{m['block']}.ffn.experts.{m['p']}.trellis"):
            table = getattr(w.experts(m["block"]), m["p"])
            e = table.entries - 1 if m["e"] is None else int(m["e"])
            if e >= table.entries - 1 and m["e"] is not None:
                raise KeyError(name)
            width, tk, tn = int(table.widths[e]), table.k // 16, table.n // 16
            if table.layout == "stack":
                trellis = table.trellis[e]
            else:
                start = int(table.offsets[e])
                trellis = (
                    table.trellis[start : start + tk * tn * width * 2].view(torch.int16).view(tk, tn, width)
                )
            return exl3_decode(
                trellis, table.suh[e], table.svh[e], int(table.codebooks[e]), dtype=torch.float32
            )
        if w.has(name):
            return w.native(name)
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)


def reference_layers(model, tokens: list[int], engram_rows=None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits [n, V], each layer's output streams [n, hc, D]) of one fresh sequence through the reference."""
    layers: list[torch.Tensor] = []
    block = model._block

    def record(*args, **kwargs):
        streams, pre = block(*args, **kwargs)
        layers.append(streams)
        return streams, pre

    model._block = record
    try:
        logits = model.forward([tokens], [model.new_state()], engram_rows)[0]
    finally:
        del model._block
    return logits, layers


def fast_layers(runner, slot: int, tokens: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(logits [n, V], each layer's output streams [n, hc, D]) of a fresh sequence in `slot` (released after)."""
    forward = runner.forward
    forward.trace = []
    try:
        logits = runner.logits_of(slot, tokens, 0)
        trace = forward.trace
    finally:
        forward.trace = None
        runner.release(slot)
    n = forward.cfg.num_hidden_layers
    steps = len(trace) // n
    layers = [torch.cat([trace[s * n + i] for s in range(steps)])[: len(tokens)] for i in range(n)]
    return logits, layers
