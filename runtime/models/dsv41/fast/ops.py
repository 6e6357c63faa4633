"""The compute the fast forward hands to kernels: EXL3 products, the MoE, the Engram row gather, bf16 products.

`TritonOps` runs the Triton kernels (tfc.kernels, public entry points, imported when the ops are made so the
interpreter's copy is used under TRITON_INTERPRET=1). With `exact` (the default) a row's bits never depend on how
many rows are live: the forward hands the EXL3 GEMM chunks of 16 rows (64 where its row-free launch takes them,
`exl3_gemv.launch_rows`; padding rows included) and the key's live rows, which a `row_free` launch
(exl3_launch.GemmConfig) runs alone, each with the bits it has among 16; the MoE,
which runs the live rows' pairs only, gets its k-splits and decode chosen once per table for one token's pairs
(`moe_config`) instead of per call from the pair count. The prefill forward's twin (`for_prefill`) sends every EXL3 product
and MoE to the many-row kernels (kernels/exl3/rows.py), whose rows are each summed alone in one order whatever
the rows, so a prompt token's bits depend neither on its chunk nor on the rows beside it (they differ from the
decode kernels' bits: another summation order). The kernels' torch references stand in on machines without a
GPU (ops_reference.py).
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

import torch
from tfc.runtime.models.dsv41.fast.graph_keys import CHUNK_ROWS
from tfc.runtime.models.dsv41.fast.row_chunks import by_chunks
from tfc.runtime.models.dsv41.fast.weights import Exl3Linear, ExpertTables


class Ops(Protocol):
    """What the forward computes through kernels (fp32 activations in and out)."""

    exact: bool

    def linear(self, x: torch.Tensor, lin: Exl3Linear, live: int | None = None) -> torch.Tensor:
        """x [r, k] @ W [k, n] -> fp32 [r, n]; with `live`, rows from `live` on are zeros (a wanted row's
        values unchanged)."""
        ...

    def linear_groups(self, x: torch.Tensor, lins: list[Exl3Linear], live: int | None = None) -> torch.Tensor:
        """x [r, G * k] @ G groups of one shape, group g on columns g * k.. -> fp32 [r, G * n], each group's
        values as its own `linear` gives them (`live` as there)."""
        ...

    def moe(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, tables: ExpertTables,
            limit: float) -> torch.Tensor:  # fmt: skip
        """Routed experts ids [r, k] (weights [r, k]) plus the shared expert, clamped SwiGLU -> fp32 [r, D]."""
        ...

    def engram_rows(self, table: torch.Tensor, ids: torch.Tensor, head_dim: int, row_lo: int) -> torch.Tensor:
        """bf16 [r, C * head_dim] of global table rows ids [r, C] from a shard starting at row_lo."""
        ...

    def column(self, x: torch.Tensor, lin: Exl3Linear, full: int) -> torch.Tensor:
        """x @ a column share of a product `full` columns wide -> fp32, each value as the whole product's."""
        ...

    def rows_fixed(self, x: torch.Tensor, lin: Exl3Linear, full: int) -> torch.Tensor:
        """x @ a row share of a product `full` rows deep -> fixed-point words int64 [2, r, n] (numerics.py)."""
        ...

    def moe_fixed(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, tables: ExpertTables,
                  limit: float, full: int) -> torch.Tensor:  # fmt: skip
        """`moe` over a share of the experts' width (`full` whole) -> fixed-point words int64 [2, r, D]."""
        ...

    def fixed_value(self, acc: torch.Tensor) -> torch.Tensor:
        """fp32 of a fixed-point sum int64 [2, ...] (every rank's words added)."""
        ...

    def mm_bf16(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """a [r, k] bf16 @ w [n, k]^T bf16 -> fp32 [r, n] (products exact, fp32 sums)."""
        ...

    def for_prefill(self, rows: int) -> Ops:
        """The ops of a prefill forward of `rows`-row steps: EXL3 products and the MoE through the many-row
        kernels whatever the live rows (so a prompt token's bits do not depend on its chunk's length); may be
        these ops."""
        ...


def moe_config(
    tables: ExpertTables, topk: int, device: torch.device, interpret: bool, inter: int | None = None
) -> Any:
    """The MoE launch the kernel would pick for one token, pinned (k-splits, decode) for any number of tokens;
    `inter`: the whole expert width a tensor-parallel rank's share of it is pinned to (default: the table's);
    `interpret` is the kernels' own (exl3_tl.INTERPRET)."""
    from tfc.kernels.exl3.moe import pinned_config

    return pinned_config(tables.w1, tables.w3, tables.w2, topk, device, inter)


def padded_rows(y: torch.Tensor, live: int | None) -> torch.Tensor:
    """y with its rows from `live` on zeroed (in place; None: y as it is)."""
    if live is not None and live < y.shape[0]:
        y[live:] = 0
    return y


def per_group(ops: Ops, x: torch.Tensor, lins: list[Exl3Linear], live: int | None = None) -> torch.Tensor:
    """linear_groups as one `linear` a group (group g on x's columns g * k..), joined along the columns."""
    k = lins[0].k
    return torch.cat([ops.linear(x[:, g * k : (g + 1) * k], lin, live) for g, lin in enumerate(lins)], dim=-1)


class TritonOps:
    """The Triton kernels (a GPU, or the CPU interpreter for tiny checks)."""

    def __init__(self, device: torch.device, exact: bool = True) -> None:
        from tfc.kernels.dsv41 import engram_rows
        from tfc.kernels.exl3 import fixed as exl3_fixed
        from tfc.kernels.exl3 import gemv as exl3_gemv
        from tfc.kernels.exl3 import moe as moe_exl3
        from tfc.kernels.exl3 import rows as exl3_rows
        from tfc.kernels.exl3.tl import INTERPRET

        self.device = device
        self.exact = exact
        self.interpret = INTERPRET
        self._gemm = exl3_gemv.exl3_gemm
        self._launch_rows = exl3_gemv.launch_rows
        self._row_free, self._own = exl3_gemv.GemmConfig(row_free=True), exl3_gemv.GemmConfig()
        self._fixed_value = exl3_fixed.fixed_value
        self._pinned: dict[tuple[str, int], Any] = {}
        self._moe = moe_exl3.moe_exl3
        self._gemm_rows = exl3_rows.exl3_gemm_rows
        self._moe_rows, self._moe_scratch = exl3_rows.moe_rows, exl3_rows.moe_scratch
        self.many_rows = False
        self.step_rows = 0  # the prefill twin's step width (for_prefill)
        self._moe_default = moe_exl3.MoeConfig()
        self._gather = engram_rows.gather_rows
        self._lut = engram_rows.bf16_lut(device)
        self._configs: dict[tuple[int, int], Any] = {}
        self._group_offsets = exl3_gemv.group_offsets
        self._groups: dict[tuple[str, ...], torch.Tensor | None] = {}
        self.notes: list[str] = []
        self._mm_dtype = device.type == "cuda" and self._probe_mm_dtype()

    def _probe_mm_dtype(self) -> bool:
        """Whether this torch's bf16 x bf16 -> fp32 matmul (aten::mm.dtype) gives fp32 sums of exact products at
        the router's shape ([3 x 16, 5120] x [5120, 384]^T); else bf16 products widen their weight per call."""
        gen = torch.Generator(device=self.device).manual_seed(0)
        a = torch.randn(48, 5120, device=self.device, generator=gen).bfloat16()
        w = torch.randn(384, 5120, device=self.device, generator=gen).bfloat16()
        try:
            got = torch.ops.aten.mm.dtype(a, w.t(), torch.float32)
        except Exception as error:  # absent, or not for this dtype / device: fall back
            self.notes.append(
                f"aten::mm.dtype unavailable ({type(error).__name__}): bf16 products widen per call"
            )
            return False
        want = a.double() @ w.double().t()
        err = float((got.double() - want).abs().max() / want.abs().max())
        if err > 1e-5:
            self.notes.append(f"aten::mm.dtype off by {err:.2e} of its scale: bf16 products widen per call")
        return err <= 1e-5

    def for_prefill(self, rows: int) -> TritonOps:
        """A twin of these ops on the many-row kernels (kernels/exl3/rows.py) for `rows`-row steps, sharing
        their state; its MoE's path is chosen by that width, never by a call's live rows."""
        twin = copy.copy(self)
        twin.many_rows = True
        twin.step_rows = rows
        return twin

    def linear(self, x: torch.Tensor, lin: Exl3Linear, live: int | None = None) -> torch.Tensor:
        """The fused EXL3 GEMV/GEMM on the arena's trellis, the partial sums of the `live` rows only (the
        many-row product on the prefill twin, every row)."""
        if self.many_rows:
            return padded_rows(self._gemm_rows(x, lin.trellis, lin.suh, lin.svh, lin.codebook), live)
        config = self._config()
        return by_chunks(
            lambda rows, lv, out: self._gemm(rows, lin.trellis, lin.suh, lin.svh, lin.codebook, out_dtype=torch.float32,
                                             live=lv, out=out, config=config),
            x, live, columns=lin.n, chunk=self._launch_rows(config, lin.trellis.shape),
        )  # fmt: skip

    def _config(self) -> Any:
        """The decode steps' EXL3 launch: row-free where exact, else each shape's own."""
        return self._row_free if self.exact else self._own

    def linear_groups(self, x: torch.Tensor, lins: list[Exl3Linear], live: int | None = None) -> torch.Tensor:
        """One grouped GEMM launch (rotation, products, sums) for groups of one shape, width and codebook; each
        group its own `linear` on the prefill twin or where they differ."""
        key = tuple(lin.name for lin in lins)
        if key not in self._groups:
            first = lins[0]
            same = all(
                lin.trellis.shape == first.trellis.shape and lin.codebook == first.codebook for lin in lins
            )
            self._groups[key] = (
                self._group_offsets([lin.trellis for lin in lins], [lin.suh for lin in lins],
                                    [lin.svh for lin in lins]) if same and len(lins) > 1 else None
            )  # fmt: skip
        offsets = self._groups[key]
        if self.many_rows or offsets is None:
            return per_group(self, x, lins, live)
        first, config = lins[0], self._config()
        return by_chunks(
            lambda rows, lv, out: self._gemm(rows, first.trellis, first.suh, first.svh, first.codebook,
                                             out_dtype=torch.float32, groups=offsets, live=lv, out=out,
                                             config=config),
            x, live, columns=len(lins) * first.n, chunk=self._launch_rows(config, first.trellis.shape),
        )  # fmt: skip

    def moe(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, tables: ExpertTables,
            limit: float) -> torch.Tensor:  # fmt: skip
        """The MoE kernel over the block's expert tables (grouped by expert on the prefill twin)."""
        if self.many_rows:
            scratch = self._moe_scratch(self.step_rows)
            return self._moe_rows(x, ids, weights, tables.w1, tables.w3, tables.w2, swiglu_limit=limit,
                                  scratch=scratch)  # fmt: skip
        config = self._moe_default
        if self.exact:
            key = (id(tables), 0)
            if key not in self._configs:
                self._configs[key] = moe_config(tables, ids.shape[1], self.device, self.interpret)
            config = self._configs[key]
        return self._moe(x, ids, weights, tables.w1, tables.w3, tables.w2, swiglu_limit=limit,
                         out_dtype=torch.float32, config=config)  # fmt: skip

    def _pin(self, lin: Exl3Linear, rows: int, k: int, n: int) -> Any:
        """The GEMM launch of the whole k x n product this share belongs to (exl3_launch.pinned_config)."""
        key = (lin.name, rows)
        if key not in self._pinned:
            from tfc.kernels.exl3.launch import GemmConfig, pinned_config

            self._pinned[key] = pinned_config(GemmConfig(), rows, lin.trellis.shape[-1], k, n, self.device)
        return self._pinned[key]

    def column(self, x: torch.Tensor, lin: Exl3Linear, full: int) -> torch.Tensor:
        """A column share of the k x `full` product, launched as the whole product is (so with its bits)."""
        config = self._pin(lin, min(x.shape[0], CHUNK_ROWS), lin.k, full)
        return by_chunks(lambda rows, _, out: self._gemm(rows, lin.trellis, lin.suh, lin.svh, lin.codebook,
                                                         out_dtype=torch.float32, config=config, out=out),
                         x, columns=lin.n)  # fmt: skip

    def rows_fixed(self, x: torch.Tensor, lin: Exl3Linear, full: int) -> torch.Tensor:
        """A row share of the `full` x n product as fixed-point words [2, r, n], decoded as the whole product is."""
        config = self._pin(lin, min(x.shape[0], CHUNK_ROWS), full, lin.n)
        return by_chunks(lambda rows, _, __: self._gemm(rows, lin.trellis, lin.suh, lin.svh, lin.codebook,
                                                        config=config, fixed=True), x, dim=1)  # fmt: skip

    def moe_fixed(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, tables: ExpertTables,
                  limit: float, full: int) -> torch.Tensor:  # fmt: skip
        """A share of the experts' width (`full` whole) as fixed-point words [2, r, D], launched as the whole."""
        key = (id(tables), full)
        if key not in self._configs:
            self._configs[key] = moe_config(tables, ids.shape[1], self.device, self.interpret, full)
        return self._moe(x, ids, weights, tables.w1, tables.w3, tables.w2, swiglu_limit=limit,
                         config=self._configs[key], fixed=True)  # fmt: skip

    def fixed_value(self, acc: torch.Tensor) -> torch.Tensor:
        """fp32 of a fixed-point sum [2, ...] (one kernel)."""
        return self._fixed_value(acc)

    def engram_rows(self, table: torch.Tensor, ids: torch.Tensor, head_dim: int, row_lo: int) -> torch.Tensor:
        """The Engram gather kernel (e4m3 + e8m0 records -> bf16)."""
        return self._gather(table, ids, head_dim, row_lo, lut=self._lut)

    def mm_bf16(self, a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """cuBLAS bf16 with fp32 output, reading w as stored."""
        if self._mm_dtype:
            return torch.ops.aten.mm.dtype(a, w.t(), torch.float32)
        return a.float() @ w.float().t()
