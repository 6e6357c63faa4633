"""Rotary tables on the device: cos / sin [positions, rope_dim / 2] of the `main` and `compress` ropes, made once.

Built exactly as the reference's fp32 `Rope.cos_sin` (fp32 angles, cos and sin in fp64 then rounded), so a
row lookup gives the reference's values bit for bit; interleaved rotation is the reference's `apply_rope`.
"""

from __future__ import annotations

import torch
from tfc.runtime.models.dsv41.config import Dsv41Config
from tfc.runtime.models.dsv41.reference.rope import apply_rope, build_rope

__all__ = ["RopeTables", "apply_rope"]


class RopeTables:
    """Both ropes' cos / sin tables for positions [0, positions)."""

    def __init__(self, cfg: Dsv41Config, positions: int, device: torch.device) -> None:
        rope = build_rope(cfg)
        pos = torch.arange(positions, dtype=torch.float32).unsqueeze(-1)
        self.tables: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for kind, inv in (("main", rope.main), ("compress", rope.compress)):
            angles = (pos * inv.to(torch.float32)).double()
            self.tables[kind] = (angles.cos().float().to(device), angles.sin().float().to(device))
        self.positions = positions

    def rows(self, kind: str, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [r, rope_dim / 2] at integer positions [r] (a gather)."""
        cos, sin = self.tables[kind]
        return cos[positions], sin[positions]

    @property
    def nbytes(self) -> int:
        """Bytes the tables take."""
        return sum(t.numel() * 4 for pair in self.tables.values() for t in pair)
