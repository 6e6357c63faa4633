"""Checks only: the reference forward's weights decoded on the device from the same arena views the fast forward reads.

`DeviceDense` is the mapping `Dsv41Model` takes (pack name -> dense [in, out]): natives are the arena's views,
EXL3 groups and expert-table entries are decoded on first use with the kernels' Triton dense decode
(kernels/exl3_decode.py, itself tested against the numpy reference). It lets a GPU check the fast forward
against the reference at Flash geometry, where the numpy decode would take minutes; nothing serves from it.
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
