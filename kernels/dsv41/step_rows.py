"""A step's row addresses as Triton kernels: what runtime/models/dsv41/fast/step_context.py derives from the slots
and positions in torch, one launch each instead of a chain of small int64 kernels.

`ring_rows`: each row's window-ring row to write and the `window` rows it reads, and which of those are real;
`ratio_rows`: one compress ratio's visible entries, the pool row of the entry a row completes (0: scratch) and
the first position of its group; `page_rows`: the pool rows of entries through each row's page table. Integer
arithmetic in int64 with torch's floor division and modulo (the sign of the divisor), so the results are
torch's exactly, at any row count. Launches only (CUDA-graph safe); each row's results read its own inputs
only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class StepRowsConfig:
    """Launch values of the step's row addresses (any of them gives the same integers)."""

    rows_a_program: int = 64  # ratio_rows' rows a program
    columns_a_program: int = 1024  # page_rows' entries a program


@triton.jit
def _floor_div(a, b):
    """a // b rounded down (b > 0), as torch.div(..., rounding_mode="floor")."""
    q = a // b
    return tl.where((a % b != 0) & (a < 0), q - 1, q)


@triton.jit
def _floor_mod(a, b):
    """a % b with b's sign (b > 0), as torch's %."""
    m = a % b
    return tl.where(m < 0, m + b, m)


@triton.jit
def _ring_kernel(slots_ptr, pos_ptr, write_ptr, read_ptr, real_ptr, ring, WINDOW: tl.constexpr,
                 BLOCK_W: tl.constexpr):  # fmt: skip
    """One row: the ring row it writes, the WINDOW rows it reads and which are real (position >= 0)."""
    r = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + r).to(tl.int64)
    p = tl.load(pos_ptr + r).to(tl.int64)
    tl.store(write_ptr + r, slot * ring + _floor_mod(p, ring))
    j = tl.arange(0, BLOCK_W)
    seen = p - (WINDOW - 1) + j
    keep = j < WINDOW
    tl.store(read_ptr + r * WINDOW + j, slot * ring + _floor_mod(seen, ring), mask=keep)
    tl.store(real_ptr + r * WINDOW + j, (seen >= 0).to(tl.uint8), mask=keep)


def ring_rows(slots: torch.Tensor, positions: torch.Tensor, window: int,
              ring: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(ring row each row writes [R], the ring rows it reads [R, window], which are real [R, window] bool) as
    step_context.ring_rows."""
    rows = positions.shape[0]
    if slots.shape != positions.shape or positions.dim() != 1 or window < 1 or ring < 1:
        raise ValueError(f"ring_rows takes slots and positions [R], window and ring >= 1: {tuple(slots.shape)}, "
                         f"{tuple(positions.shape)}, {window}, {ring}")  # fmt: skip
    dev = positions.device
    write = torch.empty(rows, dtype=torch.int64, device=dev)
    read = torch.empty(rows, window, dtype=torch.int64, device=dev)
    real = torch.empty(rows, window, dtype=torch.bool, device=dev)
    if rows:
        _ring_kernel[(rows,)](
            slots.contiguous(), positions.contiguous(), write, read, real.view(torch.uint8), ring, WINDOW=window,
            BLOCK_W=triton.next_power_of_2(window), num_warps=1,
        )  # fmt: skip
    return write, read, real


@triton.jit
def _ratio_kernel(pos_ptr, table_ptr, t_stride, visible_ptr, write_ptr, start_ptr, R, ratio, per_page,
                  BLOCK_R: tl.constexpr):  # fmt: skip
    """BLOCK_R rows: visible entries, the pool row of the entry each completes (0: none), its group's start."""
    r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    inside = r < R
    p = tl.load(pos_ptr + r, mask=inside, other=0).to(tl.int64)
    entry = _floor_div(p, ratio)
    closes = inside & (_floor_mod(p + 1, ratio) == 0)
    page = tl.load(table_ptr + r * t_stride + _floor_div(entry, per_page), mask=closes, other=0).to(tl.int64)
    tl.store(visible_ptr + r, _floor_div(p + 1, ratio), mask=inside)
    tl.store(write_ptr + r, tl.where(closes, page * per_page + _floor_mod(entry, per_page), 0), mask=inside)
    tl.store(start_ptr + r, p + 1 - ratio, mask=inside)


def ratio_rows(positions: torch.Tensor, table: torch.Tensor, ratio: int, per_page: int,
               config: StepRowsConfig = StepRowsConfig()) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """(visible entries [R], pool row of the entry each row completes [R], its group's first position [R]) as
    step_context.ratio_rows; table [R, pages] int64 page ids."""
    rows = positions.shape[0]
    if positions.dim() != 1 or table.dim() != 2 or table.shape[0] != rows or ratio < 1 or per_page < 1:
        raise ValueError(f"ratio_rows takes positions [R], table [R, pages], ratio and per_page >= 1: "
                         f"{tuple(positions.shape)}, {tuple(table.shape)}, {ratio}, {per_page}")  # fmt: skip
    out = torch.empty(3, rows, dtype=torch.int64, device=positions.device)
    table = table if table.stride(1) == 1 else table.contiguous()
    if rows:
        block = min(config.rows_a_program, triton.next_power_of_2(rows))
        _ratio_kernel[(triton.cdiv(rows, block),)](
            positions.contiguous(), table, table.stride(0), out[0], out[1], out[2], rows, ratio, per_page,
            BLOCK_R=block, num_warps=1,
        )  # fmt: skip
    return out[0], out[1], out[2]


@triton.jit
def _page_kernel(entry_ptr, table_ptr, out_ptr, K, t_stride, per_page, BLOCK: tl.constexpr):
    """One row's BLOCK entries: the pool row of each through the row's page ids."""
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = c < K
    e = tl.load(entry_ptr + r * K + c, mask=inside, other=0).to(tl.int64)
    page = tl.load(table_ptr + r * t_stride + _floor_div(e, per_page), mask=inside, other=0).to(tl.int64)
    tl.store(out_ptr + r * K + c, page * per_page + _floor_mod(e, per_page), mask=inside)


def page_rows(table: torch.Tensor, entry: torch.Tensor, per_page: int,
              config: StepRowsConfig = StepRowsConfig()) -> torch.Tensor:  # fmt: skip
    """Pool rows [R, k] of entries [R, k] through each row's page ids table [R, pages], as step_context.page_rows."""
    if entry.dim() != 2 or table.dim() != 2 or table.shape[0] != entry.shape[0] or per_page < 1:
        raise ValueError(f"page_rows takes table [R, pages], entry [R, k], per_page >= 1: {tuple(table.shape)}, "
                         f"{tuple(entry.shape)}, {per_page}")  # fmt: skip
    rows, k = entry.shape
    out = torch.empty(rows, k, dtype=torch.int64, device=entry.device)
    table = table if table.stride(1) == 1 else table.contiguous()
    if rows and k:
        block = min(config.columns_a_program, triton.next_power_of_2(k))
        _page_kernel[(rows, triton.cdiv(k, block))](
            entry.contiguous(), table, out, k, table.stride(0), per_page, BLOCK=block,
            num_warps=max(1, min(4, block // 256)),
        )  # fmt: skip
    return out


__all__ = ["StepRowsConfig", "page_rows", "ratio_rows", "ring_rows"]
