"""The attention's keys (kernels/dsv41/attend_rows.py): read back from the KV memory's rows, or from bf16 tables.

A window key is an FP8 ring row (e4m3 values, a UE8M0 scale every 32), an entry key an FP4 entry (e2m1 values,
low nibble first, an e4m3 scale every 16); runtime/models/dsv41/fast/kv/rows.py packs both. Every key is exact in
bf16 (an e4m3 value times a power of two, an e2m1 value times an e4m3 one), so `read_keys` gives the same values
whether it decodes the packed rows where they are or loads a bf16 table that `decoded_table` decoded once.
`predecodes` says when a call is worth the tables: from `AttendConfig.predecode_rows` rows (a prefill step's),
when its runs would decode the tables' rows at least `predecode` times over (each row's window overlaps its
neighbours', every block of heads decodes its keys again), up to `predecode_bytes` of tables. A decode step's few
rows would pay for the whole pool that way; their own keys are gathered instead (`gathered_keys`: each row's window
keys and entries decoded once into a bf16 table of its own, up to `gather_bytes` a call), which the runs then read
as a table; past that the runs decode the keys where they lie.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from tfc.kernels.dsv41.stage_tl import e2m1_value, e4m3_value, ue8m0_value

__all__ = ["AttendConfig", "decoded_table", "gathered_keys", "gathers", "predecodes", "read_keys"]


@dataclass(frozen=True)
class AttendConfig:
    """Launch values of attend_rows and its keys (keys_a_block and split_blocks set a row's summation order; the
    others change no bit)."""

    predecode: int = 4  # the times over a call's runs must decode the tables' rows to decode the tables first
    predecode_rows: int = 64  # ... from this many rows a call
    predecode_bytes: int = 1 << 30  # ... up to this many bytes of tables
    decode_rows: int = 16  # table rows a program of the table decode takes
    gather_bytes: int = 64 << 20  # the most bytes of gathered keys a call makes (past it: in the runs)
    gather_keys: int = 16  # keys a program of the gather takes
    heads_a_program: int = 16  # heads a program of attend_rows takes (BLOCK_H)
    keys_a_block: int = 32  # keys a step of a program's online softmax takes (BLOCK_K)
    split_blocks: int = 4  # key blocks a program of attend_rows' first launch walks (a power of two)
    # warps a program; None: 8 at d > 256 reading packed keys, whose decode takes registers, else 4
    num_warps: int | None = None
    max_scratch: int = 64 << 20  # bytes of partials one launch of rows may use
    # The key loop unpipelined: at d = 512 the default 3 stages' prefetched indices and bytes spill registers
    # (ptxas for sm_90: benchmarks/stage_kernels_sm90.py).
    stages: int = 1


def predecodes(rows: int, head_blocks: int, keys: int, table_rows: int, head_dim: int,
               config: AttendConfig = AttendConfig()) -> bool:  # fmt: skip
    """Whether a call of `rows` rows decodes its key tables to bf16 first: the same keys, so the same bits."""
    worth = rows * head_blocks * keys >= config.predecode * table_rows
    return rows >= config.predecode_rows and worth and table_rows * head_dim * 2 <= config.predecode_bytes


def gathers(rows: int, keys: int, head_dim: int, decoded: bool,
            config: AttendConfig = AttendConfig()) -> bool:  # fmt: skip
    """Whether a call whose tables are not decoded first (`decoded`) gathers its rows' keys: the same keys."""
    return not decoded and rows * keys * head_dim * 2 <= config.gather_bytes


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
    """BLOCK_R rows of an FP8 ring (or FP4 entries, ENTRY) decoded into a bf16 table [n, D], exactly."""
    row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    ok = row < n
    c = tl.arange(0, D)
    kv = read_keys(src_ptr, row, ok, c, s_src, D, ENTRY, False, tl.bfloat16)
    tl.store(out_ptr + row[:, None] * D + c[None, :], kv, mask=ok[:, None])


def decoded_table(packed: torch.Tensor, head_dim: int, entry: bool,
                  config: AttendConfig = AttendConfig()) -> torch.Tensor:  # fmt: skip
    """bf16 [N, head_dim] of FP8 ring rows (or FP4 entries, entry): every key's exact value, as read_keys gives it."""
    n = packed.shape[0]
    out = torch.empty((n, head_dim), dtype=torch.bfloat16, device=packed.device)
    if n:
        _decode_kernel[(triton.cdiv(n, config.decode_rows),)](
            packed, out, n, packed.stride(0), D=head_dim, ENTRY=entry, BLOCK_R=config.decode_rows, num_warps=4
        )
    return out


@triton.jit
def _gather_kernel(ring_ptr, read_ptr, valid_ptr, ent_ptr, at_ptr, ok_ptr, out_ptr, s_ring, s_read_r, s_read_w,
                   s_valid_r, s_valid_w, s_ent, s_at_r, s_at_k, s_ok_r, s_ok_k, W, KT, W_BLOCKS,
                   D: tl.constexpr, BLOCK_R: tl.constexpr):  # fmt: skip
    """BLOCK_R keys of row program_id(0) decoded to bf16 at out[r, key] (out [rows, W + KT, D]): its window keys
    ring[read[r, j]] where valid, then its entries entries[at[r, j]] where ok; keys not there are not written."""
    r = tl.program_id(0).to(tl.int64)
    b = tl.program_id(1)
    c = tl.arange(0, D)
    if b < W_BLOCKS:
        j = b * BLOCK_R + tl.arange(0, BLOCK_R)
        ok = tl.load(valid_ptr + r * s_valid_r + j * s_valid_w, mask=j < W, other=0) != 0
        row = tl.load(read_ptr + r * s_read_r + j * s_read_w, mask=ok, other=0)
        kv = read_keys(ring_ptr, row, ok, c, s_ring, D, False, False, tl.bfloat16)
        at = j
    else:
        j = (b - W_BLOCKS) * BLOCK_R + tl.arange(0, BLOCK_R)
        ok = tl.load(ok_ptr + r * s_ok_r + j * s_ok_k, mask=j < KT, other=0) != 0
        row = tl.load(at_ptr + r * s_at_r + j * s_at_k, mask=ok, other=0)
        kv = read_keys(ent_ptr, row, ok, c, s_ent, D, True, False, tl.bfloat16)
        at = W + j
    tl.store(out_ptr + (r * (W + KT) + at)[:, None] * D + c[None, :], kv, mask=ok[:, None])


_POSITIONS: dict = {}


def _capturing(t: torch.Tensor) -> bool:
    """Whether t's device's current stream is capturing a CUDA graph."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def gathered_keys(ring, read, valid8, entries, at, ok8, head_dim: int, config: AttendConfig = AttendConfig()):
    """(keys bf16 [R * (W + KT), d], window index [R, W], entry index [R, KT]): each row's window keys and entries
    (ring[read] where valid, entries[at] where ok; uint8 masks) decoded once, exactly, with the indices the runs
    read them by (row r's keys at r * (W + KT) on; keys not there are left unwritten and never read)."""
    rows, window = read.shape
    kt = 0 if entries is None else at.shape[1]
    out = torch.empty((rows * (window + kt), head_dim), dtype=torch.bfloat16, device=read.device)
    key = (rows, window, kt, read.device)
    idx = _POSITIONS.get(key)
    if idx is None:
        idx = torch.arange(rows * (window + kt), device=read.device).view(rows, window + kt)
        if not _capturing(read):  # made inside a capture, it holds its values only once that graph replays
            _POSITIONS[key] = idx
    if entries is None:
        entries, at, ok8 = ring, read, valid8  # no entry blocks: never read
    w_blocks = triton.cdiv(window, config.gather_keys)
    _gather_kernel[(rows, w_blocks + triton.cdiv(kt, config.gather_keys))](
        ring, read, valid8, entries, at, ok8, out, ring.stride(0), read.stride(0), read.stride(1),
        valid8.stride(0), valid8.stride(1), entries.stride(0), at.stride(0), at.stride(1), ok8.stride(0),
        ok8.stride(1), window, kt, w_blocks, D=head_dim, BLOCK_R=config.gather_keys, num_warps=4,
    )  # fmt: skip
    return out, idx[:, :window], idx[:, window:]
