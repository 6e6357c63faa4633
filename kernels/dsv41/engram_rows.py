"""Engram row gather: 264-byte e4m3+e8m0 table rows -> bf16 values, a torch reference and a Triton kernel."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

SCALE_BLOCK = 32  # values per e8m0 scale byte
# sha256 of the bf16 LUT [scale][byte] as published by TensorFold (fixtures/engram-rows-ref.txt).
LUT_SHA256 = "ac4091794caec6f553a226c3857da2756d0b29c4c7b24e02ce61274a3df93185"


@dataclass(frozen=True)
class GatherConfig:
    """Launch values of the row gather (any of them gives the same bits)."""

    block_r: int = 8  # lookups a program (benchmarks/engram_gather_h200.py sweeps it)


def scale_values(scale: torch.Tensor) -> torch.Tensor:
    """e8m0 bytes -> fp32 2^(s-127), built from the exponent bits: s=0 gives 0, s=255 gives inf."""
    return (scale.to(torch.int32) << 23).view(torch.float32)


def decode_rows_reference(records: torch.Tensor, head_dim: int) -> torch.Tensor:
    """bf16 [n, head_dim] of uint8 records [n, head_dim + head_dim/32]: e4m3 * 2^(scale-127)."""
    n_scales = head_dim // SCALE_BLOCK
    if records.dtype != torch.uint8 or records.shape[-1] != head_dim + n_scales:
        raise ValueError(
            f"records must be uint8 [..., {head_dim + n_scales}], got {records.dtype} {tuple(records.shape)}"
        )
    values = records[..., :head_dim].contiguous().view(torch.float8_e4m3fn).float()
    scales = scale_values(records[..., head_dim:]).repeat_interleave(SCALE_BLOCK, dim=-1)
    return (values * scales).to(torch.bfloat16)


def gather_rows_reference(
    table: torch.Tensor, rows: torch.Tensor, head_dim: int, row_lo: int = 0
) -> torch.Tensor:
    """bf16 [T, C*head_dim]: the records of global `rows` [T, C] from a shard that starts at `row_lo`."""
    local = rows.to(torch.int64) - row_lo
    if local.numel() and (int(local.min()) < 0 or int(local.max()) >= table.shape[0]):
        raise IndexError(f"Engram rows outside the shard [{row_lo}, {row_lo + table.shape[0]})")
    out = decode_rows_reference(table[local.reshape(-1)], head_dim)
    return out.reshape(*rows.shape[:-1], rows.shape[-1] * head_dim)


@functools.cache
def _lut_cpu() -> torch.Tensor:
    byte = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(torch.float8_e4m3fn).float()
    scale = scale_values(torch.arange(256, dtype=torch.int32))
    return (scale[:, None] * byte[None, :]).to(torch.bfloat16).reshape(-1)


def bf16_lut(device: torch.device | str = "cpu") -> torch.Tensor:
    """The 65,536-entry bf16 table indexed by (scale << 8) | byte; equals the reference bit for bit."""
    return _lut_cpu().to(device)


@triton.jit
def _gather_kernel(
    table_ptr,
    rows_ptr,
    lut_ptr,
    out_ptr,
    n_lookups,
    row_lo,
    ROW_BYTES: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    rmask = r < n_lookups
    row = tl.load(rows_ptr + r, mask=rmask, other=row_lo).to(tl.int64) - row_lo
    c = tl.arange(0, HEAD_DIM)
    base = row[:, None] * ROW_BYTES
    mask = rmask[:, None]
    byte = tl.load(table_ptr + base + c[None, :], mask=mask, other=0).to(tl.int32)
    scale = tl.load(table_ptr + base + HEAD_DIM + (c // 32)[None, :], mask=mask, other=0).to(tl.int32)
    value = tl.load(lut_ptr + ((scale << 8) | byte), mask=mask, other=0)
    tl.store(out_ptr + r.to(tl.int64)[:, None] * HEAD_DIM + c[None, :], value, mask=mask)


def gather_rows(
    table: torch.Tensor,
    rows: torch.Tensor,
    head_dim: int,
    row_lo: int = 0,
    lut: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    config: GatherConfig = GatherConfig(),
) -> torch.Tensor:
    """Triton gather: bf16 [T, C*head_dim] of global `rows` [T, C]; rows must lie in the shard."""
    row_bytes = head_dim + head_dim // SCALE_BLOCK
    if (
        table.dtype != torch.uint8
        or table.dim() != 2
        or table.shape[1] != row_bytes
        or not table.is_contiguous()
    ):
        raise ValueError(
            f"table must be contiguous uint8 [rows, {row_bytes}], got {table.dtype} {tuple(table.shape)}"
        )
    if head_dim & (head_dim - 1) or head_dim < SCALE_BLOCK:
        raise ValueError(f"head_dim must be a power of two >= {SCALE_BLOCK}, got {head_dim}")
    flat = rows.reshape(-1).contiguous()
    lut = bf16_lut(table.device) if lut is None else lut
    shape = (*rows.shape[:-1], rows.shape[-1] * head_dim)
    if out is None:
        out = torch.empty(shape, dtype=torch.bfloat16, device=table.device)
    elif out.shape != shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise ValueError(f"out must be contiguous bf16 {shape}")
    n = flat.numel()
    if n:
        _gather_kernel[(triton.cdiv(n, config.block_r),)](
            table, flat, lut, out, n, row_lo, ROW_BYTES=row_bytes, HEAD_DIM=head_dim, BLOCK_R=config.block_r
        )
    return out
