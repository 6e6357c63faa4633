"""The fast forward's tensor-parallel products: each rank computes its values as TP=1 would, then the ranks meet.

TP=N equals TP=1 bit for bit when every value a rank keeps is computed with the same operations on the same
operands as at TP=1 (docs/parallel.md):
- column-parallel products (wq_b, the head, the experts' w1 / w3) launch the GEMM / MoE with the whole product's
  pinned config (decode, k-split), so a column's sum runs in the whole product's order;
- row-parallel products (wo_b, the experts' w2) give one partial per 128-row block as fixed-point words
  (kernels/exl3/fixed.py), summed as integers by the rank and then by the all-reduce: exact in any grouping;
- attention runs on every head (the rank's queries in place, zeros elsewhere), so its products and softmax have
  TP=1's shapes; each rank keeps its wo_a groups;
- the embedding row comes from the rank owning the id, Engram rows and logits are gathered in rank order.
A TP=1 forward built with these products (build_fast's `tp_exact`) is the reference the worlds are held to.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from tfc.runtime.models.dsv41.config import Dsv41Config
from tfc.runtime.models.dsv41.shard import Shard


class TpProducts:
    """The column / row / gather steps of one rank (or of TP=1 computed as a world would)."""

    def __init__(self, cfg: Dsv41Config, ops: Any, shard: Shard, device: torch.device) -> None:
        self.cfg, self.ops, self.shard = cfg, ops, shard
        self.heads = shard.heads or (0, cfg.num_attention_heads)
        starts = [lo for lo, _ in shard.vocab[1:]]
        self._starts = torch.tensor(starts, dtype=torch.int64, device=device)
        hd = cfg.engram_head_dim
        self._engram_spans = tuple((a * hd, b * hd) for a, b in shard.engram_cols)

    def column(self, x: torch.Tensor, lin: Any, full: int) -> torch.Tensor:
        """x @ a column share of a `full`-wide product, fp32."""
        return self.ops.column(x, lin, full)

    def rows(self, x: torch.Tensor, lin: Any, full: int) -> torch.Tensor:
        """x @ a row share of a `full`-deep product, every rank's share added (fixed-point words), fp32."""
        return self.ops.fixed_value(self.shard.comm.all_reduce(self.ops.rows_fixed(x, lin, full)))

    def moe(
        self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, tables: Any, limit: float
    ) -> torch.Tensor:
        """The MoE over a share of the experts' width, every rank's share added, fp32 [r, D]."""
        full = tables.w1.n if self.shard.world == 1 else self.cfg.moe_intermediate_size
        return self.ops.fixed_value(
            self.shard.comm.all_reduce(self.ops.moe_fixed(x, ids, weights, tables, limit, full))
        )

    def queries(self, x: torch.Tensor, lin: Any) -> torch.Tensor:
        """wq_b's output for every head [R, H * d]: this rank's heads computed, the others zero."""
        hd = self.cfg.head_dim
        return self.every_head(self.column(x, lin, self.cfg.num_attention_heads * hd), hd)

    def every_head(self, mine: torch.Tensor, per: int = 1) -> torch.Tensor:
        """A per-head last dimension (`per` values a head) of this rank's heads widened to every head, zeros."""
        lo, hi = self.heads
        heads = self.cfg.num_attention_heads
        return mine if (lo, hi) == (0, heads) else F.pad(mine, (lo * per, (heads - hi) * per))

    def head(self, x: torch.Tensor, lin: Any) -> torch.Tensor:
        """Logits fp32 [R, V]: this rank's vocabulary columns, gathered in rank order."""
        return self.shard.gather_last(self.column(x, lin, self.cfg.vocab_size), self.shard.vocab)

    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Embedding rows of ids [R] from the ranks owning them (shapes fixed by R: graph-safe)."""
        if self.shard.world == 1:
            return table[ids]
        lo, hi = self.shard.vocab[self.shard.rank]
        mine = ((ids >= lo) & (ids < hi)).unsqueeze(-1)
        local = torch.where(mine, table[(ids - lo).clamp(0, hi - lo - 1)], torch.zeros((), dtype=table.dtype,
                                                                                        device=table.device))  # fmt: skip
        everyone = torch.stack(self.shard.comm.all_gather(local))
        owner = torch.bucketize(ids, self._starts, right=True)
        return everyone[owner, torch.arange(ids.numel(), device=ids.device)]

    def engram_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Engram rows [R, C * hd] of every hash column from this rank's columns, gathered in rank order."""
        if self.shard.world == 1:
            return rows
        return self.shard.gather_last(rows, self._engram_spans)
