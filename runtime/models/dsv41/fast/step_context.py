"""What every layer of one step shares, derived on the device from the static inputs (slots, positions).

Window rows: a row at position p writes ring row p % ring of its slot and reads the `sliding_window` positions
(p - window, p] (those below 0 masked). Compressed entries of ratio r: a row at p sees (p + 1) // r entries;
it completes entry p // r when (p + 1) % r == 0 (a group of r tokens starting at p + 1 - r, rotated at that
position) and writes it to its page's row, else to the scratch row 0. Entry e of a row lives at pool row
page_table[slot, e // per_page] * per_page + e % per_page; `pages` are the page ids of the first `context`
tokens. Later layers read the latest index source's selection and the candidate source's mask from here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class RatioView:
    """One compress ratio's view of the step: visible counts, completed entries, page ids."""

    ratio: int
    per_page: int  # entries per page
    entries: int  # entries the step scores (context // ratio)
    visible: torch.Tensor  # [R] entries each row sees
    write: torch.Tensor  # [R] pool row of the entry a row completes (0: scratch)
    group_start: (
        torch.Tensor
    )  # [R] first position of the group a row closes (may be < 0 for rows that close none)
    table: torch.Tensor  # [R, max pages] page ids
    pages: torch.Tensor  # [R, context / page_tokens] page ids the scored entries live in

    def addr(self, entry: torch.Tensor) -> torch.Tensor:
        """Pool rows [R, k] of entries [R, k] of each row's slot."""
        page = torch.gather(self.table, 1, torch.div(entry, self.per_page, rounding_mode="floor"))
        return page * self.per_page + entry % self.per_page


@dataclass
class StepContext:
    """Per-step tensors of R rows shared by the layers."""

    rows: int
    slots: torch.Tensor
    positions: torch.Tensor
    rope: dict[str, tuple[torch.Tensor, torch.Tensor]]
    ring_write: torch.Tensor  # [R] flat window-ring row each row writes
    window_read: torch.Tensor  # [R, window] flat window-ring rows each row reads
    window_valid: torch.Tensor  # [R, window]
    ratios: dict[int, RatioView]
    selection: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict
    )  # index source -> (entries, valid)
    candidates: torch.Tensor | None = None  # [R, entries] of the candidate source


def step_context(rows: int, slots: torch.Tensor, positions: torch.Tensor, rope, window: int, ring: int,
                 page_table: torch.Tensor, page_tokens: int, ratios: tuple[int, ...],
                 context: int) -> StepContext:  # fmt: skip
    """The context of a step whose first `rows` static rows run, at `context` tokens."""
    slots, positions = slots[:rows], positions[:rows]
    dev = positions.device
    seen = positions.unsqueeze(-1) - (window - 1) + torch.arange(window, device=dev)
    table = page_table[slots]
    views = {}
    for r in ratios:
        per_page = page_tokens // r
        entry = torch.div(positions, r, rounding_mode="floor")
        closes = (positions + 1) % r == 0
        page = table.gather(1, torch.div(entry, per_page, rounding_mode="floor").unsqueeze(-1)).squeeze(-1)
        write = torch.where(closes, page * per_page + entry % per_page, torch.zeros_like(entry))
        views[r] = RatioView(r, per_page, context // r, torch.div(positions + 1, r, rounding_mode="floor"), write,
                             positions + 1 - r, table, table[:, : context // page_tokens])  # fmt: skip
    return StepContext(
        rows=rows,
        slots=slots,
        positions=positions,
        rope={kind: rope.rows(kind, positions) for kind in ("main", "compress")},
        ring_write=slots * ring + positions % ring,
        window_read=slots.unsqueeze(-1) * ring + seen % ring,
        window_valid=seen >= 0,
        ratios=views,
    )
