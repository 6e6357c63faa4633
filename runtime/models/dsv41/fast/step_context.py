"""What every layer of one step shares, derived on the device from the static inputs (slots, positions).

Window rows: a row at position p writes ring row p % ring of its slot and reads the `sliding_window` positions
(p - window, p] (those below 0 masked). Compressed entries of ratio r: a row at p sees (p + 1) // r entries;
it completes entry p // r when (p + 1) % r == 0 (a group of r tokens starting at p + 1 - r, rotated at that
position) and writes it to its page's row, else to the scratch row 0. Entry e of a row lives at pool row
page_table[slot, e // per_page] * per_page + e % per_page; `pages` are the page ids of the first `context`
tokens. Later layers read the latest index source's selection and the candidate source's mask from here.
Where stage kernels run, the addresses come from kernels/step_rows (one launch each, the same integers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from tfc.runtime.models.dsv41.fast.stages import stage_kernel


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
        return page_rows(self.table, entry, self.per_page)


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
    table = page_table[slots]
    views = {}
    for r in ratios:
        per_page = page_tokens // r
        visible, write, group_start = ratio_rows(positions, table, r, per_page)
        views[r] = RatioView(r, per_page, context // r, visible, write, group_start, table,
                             table[:, : context // page_tokens])  # fmt: skip
    ring_write, window_read, window_valid = ring_rows(slots, positions, window, ring)
    return StepContext(
        rows=rows,
        slots=slots,
        positions=positions,
        rope={kind: rope.rows(kind, positions) for kind in ("main", "compress")},
        ring_write=ring_write,
        window_read=window_read,
        window_valid=window_valid,
        ratios=views,
    )


def _kernel(name: str, tensor: torch.Tensor):
    """kernels/step_rows' `name` where stage kernels run on tensor's device, else None."""
    return stage_kernel(f"tfc.kernels.dsv41.step_rows:{name}", tensor)


def ring_rows(slots: torch.Tensor, positions: torch.Tensor, window: int,
              ring: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(ring row each row writes [R], the ring rows of the `window` positions it reads [R, window], which are
    real: position >= 0)."""
    kernel = _kernel("ring_rows", positions)
    if kernel is not None:
        return kernel(slots, positions, window, ring)
    seen = positions.unsqueeze(-1) - (window - 1) + torch.arange(window, device=positions.device)
    return slots * ring + positions % ring, slots.unsqueeze(-1) * ring + seen % ring, seen >= 0


def ratio_rows(positions: torch.Tensor, table: torch.Tensor, ratio: int,
               per_page: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(entries each row sees [R], the pool row of the entry it completes, 0 where none [R], the first position
    of the group it would close [R]) of one compress ratio; table [R, pages] the rows' page ids."""
    kernel = _kernel("ratio_rows", positions)
    if kernel is not None:
        return kernel(positions, table, ratio, per_page)
    entry = torch.div(positions, ratio, rounding_mode="floor")
    closes = (positions + 1) % ratio == 0
    page = table.gather(1, torch.div(entry, per_page, rounding_mode="floor").unsqueeze(-1)).squeeze(-1)
    write = torch.where(closes, page * per_page + entry % per_page, torch.zeros_like(entry))
    return torch.div(positions + 1, ratio, rounding_mode="floor"), write, positions + 1 - ratio


def page_rows(table: torch.Tensor, entry: torch.Tensor, per_page: int) -> torch.Tensor:
    """Pool rows [R, k] of entries [R, k] through each row's page ids table [R, pages]."""
    kernel = _kernel("page_rows", entry)
    if kernel is not None:
        return kernel(table, entry, per_page)
    page = torch.gather(table, 1, torch.div(entry, per_page, rounding_mode="floor"))
    return page * per_page + entry % per_page
