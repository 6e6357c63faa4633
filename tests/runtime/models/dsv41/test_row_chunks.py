"""by_chunks: a product over many rows as 16-row calls, joined or written in place, rows from `live` on zeros."""

from __future__ import annotations

import torch
from tfc.runtime.models.dsv41.fast.row_chunks import by_chunks


def test_chunks_are_16_row_calls_joined_in_order_with_the_rows_past_live_zero():
    gen = torch.Generator().manual_seed(3)
    x, w = torch.randn(70, 24, generator=gen), torch.randn(24, 40, generator=gen)
    calls = []

    def product(rows, live, out):
        calls.append((rows.shape[0], live, out is not None))
        y = rows @ w
        if live is not None:
            y[live:] = 0
        return out.copy_(y) if out is not None else y

    want = torch.cat([x[lo : lo + 16] @ w for lo in range(0, 70, 16)])
    want[37:] = 0
    joined = by_chunks(product, x, live=37)
    assert calls == [(16, None, False), (16, None, False), (16, 5, False)]  # chunks past live never run
    placed = by_chunks(product, x, live=37, columns=40)
    assert (
        torch.equal(joined, want)
        and torch.equal(placed, want)
        and calls[3:] == [(16, None, True)] * 2 + [(16, 5, True)]
    )
    assert torch.equal(
        by_chunks(product, x[:9], live=4),
        (lambda y: y.masked_fill(torch.arange(9)[:, None] >= 4, 0))(x[:9] @ w),
    )
