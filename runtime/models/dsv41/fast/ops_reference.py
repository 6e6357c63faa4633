"""The kernels' torch references standing in for them where there is no GPU (CPU runs and tests of the fast forward).

Same views, same maths as the kernels' references (kernels/exl3/reference.py, moe_exl3.moe_reference,
engram_rows.gather_rows_reference), in fp32: an EXL3 group is decoded to a dense weight once, on first use,
one 128 x 128 tile at a time (the CPU path only; the GPU path never decodes), and every MoE pair is its own
one-row product, summed in the kernel's order (routed slots, then the shared expert), so a row's result never
depends on the other rows. The tensor-parallel products (`column`, `rows_fixed`, `moe_fixed`) go one 128-value
block at a time, so a rank's share computes its values as the whole product does (docs/parallel.md).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from tfc.runtime.models.dsv41.fast.row_chunks import by_chunks
from tfc.runtime.models.dsv41.fast.weights import Exl3Linear, ExpertTables
from tfc.runtime.models.dsv41.reference.numerics import BLOCK, from_fixed, to_fixed


def column_blocks(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [r, k] @ w [k, n] in fp32, one 128-column block per GEMM of one shape (n a multiple of 128)."""
    k, n = w.shape
    blocks = w.reshape(k, n // BLOCK, BLOCK).transpose(0, 1)  # [nb, k, 128]
    return torch.matmul(x, blocks).transpose(0, 1).reshape(x.shape[0], n)


def row_words(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """int64 [2, r, n]: the fixed-point words of x[:, b] @ w[b] (fp32) summed over the 128-row blocks b of w."""
    k, n = w.shape
    xb = x.reshape(x.shape[0], k // BLOCK, BLOCK).transpose(0, 1)  # [nb, r, 128]
    parts = torch.matmul(xb, w.reshape(k // BLOCK, BLOCK, n))  # [nb, r, n]
    return to_fixed(parts.double()).sum(1)


def _pairs(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, tables: ExpertTables):
    """(token, its row fp32 [1, D], expert, weight) of every routed pair in slot order, then the shared expert."""
    shared = tables.w1.entries - 1
    for t in range(x.shape[0]):
        row = x[t : t + 1].float()
        for e, w in zip(ids[t].tolist(), weights[t].tolist(), strict=True):
            yield t, row, min(max(int(e), 0), shared - 1), float(w)
        yield t, row, shared, 1.0


def _clamped(gate: torch.Tensor, up: torch.Tensor, limit: float) -> tuple[torch.Tensor, torch.Tensor]:
    """SwiGLU's clamp (gate from above, up both ways) when limit > 0."""
    return (gate.clamp(max=limit), up.clamp(-limit, limit)) if limit > 0 else (gate, up)


class ReferenceOps:
    """fp32 torch on the host over dense weights decoded from the arena's views (cached per group / entry)."""

    exact = True

    def __init__(self) -> None:
        self._dense: dict[tuple[int, int], torch.Tensor] = {}
        self.notes = ["kernels' torch references (no GPU): EXL3 groups decoded to dense on first use"]

    def _decoded(self, key: tuple[int, int], trellis, suh, svh, codebook: int) -> torch.Tensor:
        held = self._dense.get(key)
        if held is None:
            from tfc.runtime.models.dsv41.reference.weights import dequant_tiles

            dense = dequant_tiles(trellis.cpu().numpy(), suh.cpu().numpy(), svh.cpu().numpy(), codebook)
            held = self._dense[key] = dense
        return held

    def dense(self, lin: Exl3Linear) -> torch.Tensor:
        """The group's dense weight [k, n] fp32."""
        return self._decoded((lin.trellis.data_ptr(), -1), lin.trellis, lin.suh, lin.svh, lin.codebook)

    def expert(self, table, e: int) -> torch.Tensor:
        """Entry e of an expert table, dense [k, n] fp32."""
        width, codebook = int(table.widths[e]), int(table.codebooks[e])
        tk, tn = table.k // 16, table.n // 16
        if table.layout == "stack":
            trellis = table.trellis[e]
        else:
            start = int(table.offsets[e])
            raw = table.trellis[start : start + tk * tn * width * 2].cpu().numpy()
            trellis = torch.from_numpy(raw.view(np.int16).reshape(tk, tn, width))
        return self._decoded((table.trellis.data_ptr(), e), trellis, table.suh[e], table.svh[e], codebook)

    def for_prefill(self, rows: int) -> ReferenceOps:
        """These ops: a row's result never depends on the other rows here."""
        return self

    def linear(self, x: torch.Tensor, lin: Exl3Linear, live: int | None = None) -> torch.Tensor:
        """x @ W in fp32 (rows from `live` on: zeros)."""
        from tfc.runtime.models.dsv41.fast.ops import padded_rows

        dense = self.dense(lin)
        return by_chunks(lambda rows, lv, _: padded_rows(rows.float() @ dense, lv), x, live)

    def linear_groups(self, x: torch.Tensor, lins: list[Exl3Linear], live: int | None = None) -> torch.Tensor:
        """One `linear` a group, joined along the columns."""
        from tfc.runtime.models.dsv41.fast.ops import per_group

        return per_group(self, x, lins, live)

    def moe(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, tables: ExpertTables,
            limit: float) -> torch.Tensor:  # fmt: skip
        """Each token's routed pairs in slot order, then the shared expert (weight 1)."""
        out = torch.zeros(x.shape[0], tables.w2.n)
        for t, row, e, w in _pairs(x, ids, weights, tables):
            gate, up = _clamped(row @ self.expert(tables.w1, e), row @ self.expert(tables.w3, e), limit)
            out[t] += ((F.silu(gate) * up * w) @ self.expert(tables.w2, e))[0]
        return out

    def column(self, x: torch.Tensor, lin: Exl3Linear, full: int) -> torch.Tensor:
        """x @ W one 128-column block at a time (any block range of the whole product gives its bits)."""
        dense = self.dense(lin)
        return by_chunks(lambda rows, _, __: column_blocks(rows.float(), dense), x)

    def rows_fixed(self, x: torch.Tensor, lin: Exl3Linear, full: int) -> torch.Tensor:
        """x @ W as fixed-point words [2, r, n] of its 128-row block products."""
        dense = self.dense(lin)
        return by_chunks(lambda rows, _, __: row_words(rows.float(), dense), x, dim=1)

    def moe_fixed(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, tables: ExpertTables,
                  limit: float, full: int) -> torch.Tensor:  # fmt: skip
        """`moe` as fixed-point words [2, r, D]: gate and up by column blocks, each pair's down by row blocks."""
        out = torch.zeros(2, x.shape[0], tables.w2.n, dtype=torch.int64)
        for t, row, e, w in _pairs(x, ids, weights, tables):
            gate = column_blocks(row, self.expert(tables.w1, e))
            gate, up = _clamped(gate, column_blocks(row, self.expert(tables.w3, e)), limit)
            out[:, t] += row_words(F.silu(gate) * up * w, self.expert(tables.w2, e))[:, 0]
        return out

    def fixed_value(self, acc: torch.Tensor) -> torch.Tensor:
        """fp32 of a fixed-point sum [2, ...]."""
        return from_fixed(acc).float()

    def engram_rows(self, table: torch.Tensor, ids: torch.Tensor, head_dim: int, row_lo: int) -> torch.Tensor:
        """The Engram gather's reference."""
        from tfc.kernels.dsv41.engram_rows import gather_rows_reference

        return gather_rows_reference(table, ids, head_dim, row_lo)

    def mm_bf16(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """bf16 products in fp32 (exact), summed in fp32."""
        return a.float() @ w.float().t()
