"""Per-sequence state of the DSpark drafter: one window ring of context keys per DSpark block, and its position.

Each DSpark block keeps the FP8, rotated K=V latents of the last `window` committed positions, computed from
the target's hidden state at those positions (main_x), slot = position % window, as the backbone's swa layers
do (runtime/models/dsv41/reference/state.py). A draft block only reads the rings: its own keys are never stored, so the
state moves only when committed positions are observed, and a clone taken before is a rollback point. A state
may begin mid-sequence (`start` > 0: a slot resumed from a prefix-cache snapshot, which holds no drafter
rings): its blocks then read only the positions it observed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tfc.runtime.models.dsv41.reference.state import WindowRing


@dataclass
class DraftState:
    """What one sequence's drafter carries between rounds."""

    position: int = 0  # committed positions observed = position of the next draft block's first row
    windows: dict[int, WindowRing] = field(default_factory=dict)  # DSpark block index -> its context ring
    start: int = 0  # the first position it observes (earlier ones are never in its rings)

    def clone(self) -> DraftState:
        """An independent copy (observing into one never changes the other)."""
        copies = {}
        for block, ring in self.windows.items():
            copy = WindowRing(ring.window, ring.keys.shape[1], ring.keys.dtype, ring.keys.device)
            copy.keys.copy_(ring.keys)
            copies[block] = copy
        return DraftState(self.position, copies, self.start)


def context(ring: WindowRing, position: int, start: int = 0) -> torch.Tensor:
    """The ring's keys of the last min(window, position - start) positions before `position`, oldest first."""
    first = max(start, position - ring.window)
    return ring.keys[torch.arange(first, position, device=ring.keys.device) % ring.window]
