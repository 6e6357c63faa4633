"""A step's products run 16 rows at a time, so a row's bits do not depend on how many rows share its step."""

from __future__ import annotations

from collections.abc import Callable

import torch
from tfc.runtime.models.dsv41.fast.graph_keys import CHUNK_ROWS

Chunk = Callable[[torch.Tensor, "int | None", "torch.Tensor | None"], torch.Tensor]


def by_chunks(fn: Chunk, x: torch.Tensor, live: int | None = None, dim: int = 0,
              columns: int | None = None, chunk: int = CHUNK_ROWS) -> torch.Tensor:  # fmt: skip
    """fn(chunk, its live rows or None for all, its rows of the result or None) over x's `chunk`-row chunks,
    joined along `dim`, or with `columns` written into one fp32 [rows, columns] result (no copy); chunks from
    `live` on are zeros, never computed. A call of at most `chunk` rows is fn(x, live, None)."""
    rows = x.shape[0]
    if rows <= chunk:
        return fn(x, live, None)
    out = None if columns is None else torch.empty(rows, columns, dtype=torch.float32, device=x.device)
    parts: list[torch.Tensor] = []
    for lo in range(0, rows, chunk):
        hi = min(rows, lo + chunk)
        dest = None if out is None else out[lo:hi]
        if live is not None and live <= lo:
            parts.append(
                dest.zero_() if dest is not None else torch.zeros_like(parts[0].narrow(dim, 0, hi - lo))
            )
        else:
            parts.append(fn(x[lo:hi], None if live is None or live >= hi else live - lo, dest))
    return out if out is not None else torch.cat(parts, dim=dim)
