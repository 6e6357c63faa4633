"""The attention's keys (kernels/attend_rows.py): read back from the KV memory's rows, or from bf16 tables.

A window key is an FP8 ring row (e4m3 values, a UE8M0 scale every 32), an entry key an FP4 entry (e2m1 values,
low nibble first, an e4m3 scale every 16); runtime/models/dsv41/fast/kv_rows.py packs both. Every key is exact in
bf16 (an e4m3 value times a power of two, an e2m1 value times an e4m3 one), so `read_keys` gives the same values
whether it decodes the packed rows where they are or loads a bf16 table that `decoded_table` decoded once.
`predecodes` says when a call is worth the tables: from PREDECODE_ROWS rows (a prefill step's), when its runs
would decode the tables' rows at least PREDECODE times over (each row's window overlaps its neighbours', every
block of heads decodes its keys again), up to PREDECODE_BYTES of tables; a decode step's few rows keep decoding
in place, since the tables' decode costs what the pool holds, not what the rows read.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from tfc.kernels.stage_tl import e2m1_value, e4m3_value, ue8m0_value

__all__ = ["decoded_table", "predecodes", "read_keys"]

PREDECODE = 4
PREDECODE_ROWS = 64
PREDECODE_BYTES = 1 << 30
DECODE_ROWS = 16  # table rows a program of the table decode takes


def predecodes(rows: int, head_blocks: int, keys: int, table_rows: int, head_dim: int) -> bool:
    """Whether a call of `rows` rows decodes its key tables to bf16 first: the same keys, so the same bits."""
    worth = rows * head_blocks * keys >= PREDECODE * table_rows
    return rows >= PREDECODE_ROWS and worth and table_rows * head_dim * 2 <= PREDECODE_BYTES


@triton.jit
def _window_keys(ring_ptr, row, ok, c, s_ring, D: tl.constexpr):
    """Window keys [BLOCK_K, len(c)] fp32: columns c of FP8 ring rows `row` (masked keys give 0)."""
    base = ring_ptr + row[:, None] * s_ring
    code = tl.load(base + c[None, :], mask=ok[:, None], other=0).to(tl.int32)
    sbyte = tl.load(base + D + c[None, :] // 32, mask=ok[:, None], other=0).to(tl.int32)
    return e4m3_value(code) * ue8m0_value(sbyte)


@triton.jit
def _entry_keys(ent_ptr, row, ok, c, s_ent, D: tl.constexpr):
    """Entry keys [BLOCK_K, len(c)] fp32: columns c of FP4 entries `row` (masked keys give 0)."""
    base = ent_ptr + row[:, None] * s_ent
    byte = tl.load(base + c[None, :] // 2, mask=ok[:, None], other=0).to(tl.int32)
    code = (byte >> ((c[None, :] & 1) * 4)) & 15  # low nibble first
    sbyte = tl.load(base + D // 2 + c[None, :] // 16, mask=ok[:, None], other=0).to(tl.int32)
    return e2m1_value(code) * e4m3_value(sbyte)


@triton.jit
def read_keys(keys_ptr, row, ok, c, s_keys, D: tl.constexpr, ENTRY: tl.constexpr, DECODED: tl.constexpr,
              OUT: tl.constexpr):  # fmt: skip
    """Keys [BLOCK_K, len(c)] as OUT (exact in bf16 and fp32): read from a bf16 table [N, D] (DECODED), else
    decoded from FP8 ring rows or FP4 entries (ENTRY); the same values either way (masked keys give 0)."""
    if DECODED:
        kv = tl.load(keys_ptr + row[:, None] * D + c[None, :], mask=ok[:, None], other=0.0)
    elif ENTRY:
        kv = _entry_keys(keys_ptr, row, ok, c, s_keys, D)
    else:
        kv = _window_keys(keys_ptr, row, ok, c, s_keys, D)
    return kv.to(OUT)


@triton.jit
def _decode_kernel(src_ptr, out_ptr, n, s_src, D: tl.constexpr, ENTRY: tl.constexpr, BLOCK_R: tl.constexpr):
    """DECODE_ROWS rows of an FP8 ring (or FP4 entries, ENTRY) decoded into a bf16 table [n, D], exactly."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = row < n
    c = tl.arange(0, D)
    kv = read_keys(src_ptr, row, ok, c, s_src, D, ENTRY, False, tl.bfloat16)
    tl.store(out_ptr + row[:, None] * D + c[None, :], kv, mask=ok[:, None])


def decoded_table(packed: torch.Tensor, head_dim: int, entry: bool) -> torch.Tensor:
    """bf16 [N, head_dim] of FP8 ring rows (or FP4 entries, entry): every key's exact value, as read_keys gives it."""
    n = packed.shape[0]
    out = torch.empty((n, head_dim), dtype=torch.bfloat16, device=packed.device)
    if n:
        _decode_kernel[(triton.cdiv(n, DECODE_ROWS),)](
            packed, out, n, packed.stride(0), D=head_dim, ENTRY=entry, BLOCK_R=DECODE_ROWS, num_warps=4
        )
    return out
