"""kernels/step_rows against step_context's torch code, interpreted: every integer equal.

Positions from 0 (window rows before 0 not real) to past a ring's length, rows of one slot and of many, ratios
1, 4 and 128, page ids at random, entries on page edges; a row alone gives what it gives among others.
"""

from __future__ import annotations

import pytest
import torch
from tfc.runtime.models.dsv41.fast import step_context as stage


def _rows(gen, rows, top):
    positions = torch.randint(0, top, (rows,), generator=gen)
    positions[0] = 0
    return torch.randint(0, 9, (rows,), generator=gen), positions


@pytest.mark.parametrize(("rows", "window", "ring"), [(1, 128, 160), (16, 128, 160), (37, 5, 12)])
def test_ring_rows_equal_the_stage(tk, rows, window, ring):
    slots, positions = _rows(torch.Generator().manual_seed(rows), rows, 4 * ring)
    got = tk.step_rows.ring_rows(slots, positions, window, ring)
    want = stage.ring_rows(slots, positions, window, ring)
    assert got[2].dtype == torch.bool and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    alone = tk.step_rows.ring_rows(slots[-1:], positions[-1:], window, ring)
    assert all(torch.equal(a, g[-1:]) for a, g in zip(alone, got, strict=True))


@pytest.mark.parametrize(("rows", "ratio", "per_page"), [(1, 4, 16), (16, 4, 16), (70, 1, 64), (16, 128, 1)])
def test_ratio_rows_equal_the_stage(tk, rows, ratio, per_page):
    gen = torch.Generator().manual_seed(rows + ratio)
    _, positions = _rows(gen, rows, 40 * per_page * ratio)
    positions[1:3] = torch.tensor([ratio - 1, ratio * per_page - 1])[: rows - 1]  # closes an entry, a page
    table = torch.randint(1, 1000, (rows, 48), generator=gen)
    got = tk.step_rows.ratio_rows(positions, table, ratio, per_page)
    want = stage.ratio_rows(positions, table, ratio, per_page)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert bool((got[1] != 0).any()) or rows == 1
    alone = tk.step_rows.ratio_rows(positions[-1:], table[-1:], ratio, per_page)
    assert all(torch.equal(a, g[-1:]) for a, g in zip(alone, got, strict=True))


@pytest.mark.parametrize(("rows", "k", "per_page"), [(1, 512, 16), (5, 2100, 64), (3, 7, 1)])
def test_page_rows_equal_the_stage(tk, rows, k, per_page):
    gen = torch.Generator().manual_seed(k)
    table = torch.randint(1, 1000, (rows, 40), generator=gen)
    entry = torch.randint(0, 40 * per_page, (rows, k), generator=gen)
    entry[:, 0] = per_page - 1
    got = tk.step_rows.page_rows(table[:, :40], entry, per_page)
    assert torch.equal(got, stage.page_rows(table, entry, per_page))
    one = slice(rows - 1, rows)
    assert torch.equal(tk.step_rows.page_rows(table[one], entry[one], per_page), got[one])


def test_bad_shapes_name_themselves(tk):
    with pytest.raises(ValueError, match="ring_rows takes"):
        tk.step_rows.ring_rows(torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64), 4, 8)
    with pytest.raises(ValueError, match="page_rows takes"):
        tk.step_rows.page_rows(torch.zeros(2, 4, dtype=torch.int64), torch.zeros(3, 5, dtype=torch.int64), 4)
