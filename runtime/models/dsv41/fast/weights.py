"""The fast forward's weights: typed views of the arena's segments, read in place (nothing decoded or copied).

EXL3 groups `<name>.trellis|suh|svh` (layout exl3.trellis.v1, codebook from the plan's attrs) become
`Exl3Linear`s; expert tables `<block>.ffn.experts.<w1|w2|w3>.*` (stack or ragged, E routed entries then the
shared expert) become the kernels' `ExpertTable`s (their offsets, widths and codebooks checked on the host
once); natives are views of their stored dtype and shape; an expert table the plan placed in host memory is a
view the device reads over PCIe (runtime/boot/mapped.py); Engram row shards are uint8 [rows, row bytes] views
with the row their shard starts at. Host-side assets (the Engram hash tables) are read from the image mapping.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from tfc.cache.contract import LAYOUT_ENGRAM_ROWS, LAYOUT_NATIVE, LAYOUT_RAGGED, LAYOUT_STACK, LAYOUT_TRELLIS
from tfc.packs.deepseek_v41_contract import SEG_ROW_RANGES, engram_rows_name
from tfc.runtime.models.dsv41.config import Dsv41Config

from tfc.errors import TfcError

_TABLE_LAYOUTS = {LAYOUT_STACK: "stack", LAYOUT_RAGGED: "ragged"}
CODEBOOK_IDS = {"3inst": 0, "mcg": 1, "mul1": 2}


class FastWeightError(TfcError):
    """An image segment the fast forward needs is missing or not in the layout it reads."""


@dataclass(frozen=True)
class Exl3Linear:
    """One EXL3 group as arena views: y = x @ W, W [k, n] = diag(suh) H W-hat H diag(svh)."""

    name: str
    trellis: torch.Tensor  # int16 [k/16, n/16, width]
    suh: torch.Tensor  # float16 [k]
    svh: torch.Tensor  # float16 [n]
    codebook: int

    @property
    def k(self) -> int:
        """Input features."""
        return self.suh.shape[0]

    @property
    def n(self) -> int:
        """Output features."""
        return self.svh.shape[0]

    @property
    def nbytes(self) -> int:
        """Bytes a product reads: trellis and scales."""
        return sum(t.numel() * t.element_size() for t in (self.trellis, self.suh, self.svh))


@dataclass(frozen=True)
class ExpertTables:
    """A block's MoE: gate (w1), up (w3) and down (w2) tables, shared expert last."""

    w1: Any
    w3: Any
    w2: Any

    def entry_bytes(self, e: int) -> int:
        """Trellis bytes of entry e over the three projections (what one token's pair reads)."""
        return sum(int(t.widths[e]) * (t.k // 16) * (t.n // 16) * 2 for t in (self.w1, self.w3, self.w2))


class FastWeights:
    """Views of one booted rank's segments by pack name, checked against the manifest on first use."""

    def __init__(self, image: Any, arena: Any, cfg: Dsv41Config, off_device: Any = None) -> None:
        self.image = image
        self.arena = arena
        self.off_device = off_device  # host-tier segments (cold expert tables), read in place by the device
        self.cfg = cfg
        m = image.manifest
        self._entries = {s.name: s for s in m.segments}
        self._attrs = (m.plan or {}).get("attrs", {})
        self._linears: dict[str, Exl3Linear] = {}
        self._tables: dict[str, ExpertTables] = {}

    def _entry(self, name: str, layouts: tuple[str, ...]) -> Any:
        entry = self._entries.get(name)
        if entry is None:
            raise FastWeightError(
                f"{self.image.path}: the image has no segment {name!r} (DeepSeek-V4.1 fast forward)"
            )
        if entry.layout not in layouts:
            raise FastWeightError(
                f"{self.image.path}: segment {name!r} has layout {entry.layout}, not {' or '.join(layouts)}"
            )
        return entry

    def _view(self, name: str, layouts: tuple[str, ...]) -> torch.Tensor:
        entry = self._entry(name, layouts)
        if self.off_device is not None and name in self.off_device:
            return self.off_device.view(name, entry.dtype, entry.shape)
        return self.arena.view(name, entry.dtype, entry.shape)

    def has(self, name: str) -> bool:
        """Whether the image holds a segment of that name."""
        return name in self._entries

    def native(self, name: str) -> torch.Tensor:
        """A native tensor as stored (norms, mHC, sinks, router, embedding, ...)."""
        return self._view(name, (LAYOUT_NATIVE,))

    def linear(self, name: str) -> Exl3Linear:
        """The EXL3 group `name` (e.g. `layers.3.attn.wq_a`, `head`)."""
        held = self._linears.get(name)
        if held is None:
            codebook = self._attrs.get(f"{name}.trellis", {}).get("codebook")
            if codebook not in CODEBOOK_IDS:
                raise FastWeightError(
                    f"{self.image.path}: the plan gives {name} no known codebook ({codebook!r})"
                )
            trellis = self._view(f"{name}.trellis", (LAYOUT_TRELLIS,))
            suh = self._view(f"{name}.suh", ("exl3.scales.v1",))
            svh = self._view(f"{name}.svh", ("exl3.scales.v1",))
            tk, tn, _ = trellis.shape
            if suh.shape != (16 * tk,) or svh.shape != (16 * tn,) or suh.dtype != torch.float16:
                raise FastWeightError(
                    f"{self.image.path}: {name} scales {tuple(suh.shape)}/{tuple(svh.shape)} do not fit its trellis"
                )
            held = self._linears[name] = Exl3Linear(name, trellis, suh, svh, CODEBOOK_IDS[codebook])
        return held

    def experts(self, block: str) -> ExpertTables:
        """The expert tables of `block` (e.g. `layers.3`), validated once (host reads of their index arrays)."""
        held = self._tables.get(block)
        if held is None:
            from tfc.kernels.exl3.expert_table import ExpertTable

            tables = []
            for proj in ("w1", "w3", "w2"):
                base = f"{block}.ffn.experts.{proj}"
                entry = self._entry(f"{base}.trellis", tuple(_TABLE_LAYOUTS))
                parts = [
                    self._view(f"{base}.{p}", ("exl3.experts.index.v1",))
                    for p in ("offsets", "widths", "codebooks")
                ]
                scales = [self._view(f"{base}.{p}", ("exl3.scales.v1",)) for p in ("suh", "svh")]
                trellis = self._view(f"{base}.trellis", (entry.layout,))
                tables.append(
                    ExpertTable.from_tensors(_TABLE_LAYOUTS[entry.layout], trellis, *parts, *scales)
                )
            held = self._tables[block] = ExpertTables(*tables)
        return held

    def engram_table(self, layer: int, k: int) -> tuple[torch.Tensor, int]:
        """(uint8 [rows, row bytes] view of Engram layer `layer`'s row shard, the global row it starts at)."""
        name = engram_rows_name(layer)
        table = self._view(name, (LAYOUT_ENGRAM_ROWS,))
        lo = int(self.host_array(SEG_ROW_RANGES)[k][0])
        return table, lo

    def array(self, name: str) -> np.ndarray:
        """host_array (the name shard_of reads a rank's Engram column split by)."""
        return self.host_array(name)

    def host_array(self, name: str) -> np.ndarray:
        """A segment as a numpy array from the image mapping (host-side assets)."""
        entry = self._entries[name]
        dtype = np.dtype(np.uint16 if entry.dtype == "bfloat16" else entry.dtype).newbyteorder("<")
        return np.frombuffer(self.image.image.segment(name), dtype=dtype).reshape(entry.shape)
