"""The fast attention's `attend_rows` stage in Triton: sink attention over FP8 rows, FP4 entries.

For each row r and head h (runtime/models/dsv41/fast/attention.py, `attend_rows`):

    keys     ring[read[r]] (FP8 window rows, valid[r]) then entries[at[r]] (FP4 entries, ok[r]), read by
             kernels/dsv41/attend_keys.py (kv_rows.unpack_fp8 / unpack_fp4's values); K = V, every head
    logits   q[r, h] . key * d**-0.5, -inf where the key is masked (its value zeroed), plus the sink sinks[h]
    out      softmax(logits, sink) applied to the keys, the sink's value nothing; then the inverse rope
             rotation of the trailing 2 * cos.shape[-1] channels (apply_rope(..., inverse=True))

Two launches (three with the keys decoded first, below). The first splits each row's keys into runs of
`AttendConfig.split_blocks` key blocks (window runs, then entry runs): one program per (row, block of BLOCK_H = 16 heads, run), a
grid of R x ceil(H / 16) x runs, so a one-row decode step still fills tens of multiprocessors. Each program
reads its key blocks once for all its heads and keeps an fp32 online softmax whose running maximum starts at the
sink (always finite, so a run with every key masked gives nothing) and writes its (maximum, denominator,
accumulator) to a scratch of fp32 partials. The partials of a run with no key there (a padding row's, or past a
row's entries) are the sink, 0 and 0 whatever its keys, so such a run stores them and reads nothing: the same
bits, without the work. The second, one program per (row, block of heads), folds the runs in order into the
sink's (sink, 1, 0), divides and takes the rope off.

The keys (kernels/dsv41/attend_keys.py). A prefill step's many rows read the same keys many times over, so from
`predecode_rows` rows a call (`predecodes`) the layer's ring and entry pool are first decoded to bf16 tables
(`decoded_table`, a third launch) and the runs read keys from them (DECODED) instead of decoding them where
they are. A decode step's rows gather their own keys instead (`gathers`, `gathered_keys`: each row's window keys
and entries decoded once into a table of its own, a third launch), which the runs read the same way; every
block of heads would otherwise decode them again, in registers the products need (past `gather_bytes` a call
they do). The same values every way, so the same bits.

The products. Both run on the matrix units: every key is exact in bf16 (an e4m3 value times a power of two, an
e2m1 value times an e4m3 one), and the query and the softmax weights are cut into three bf16 pieces whose sum is
the fp32 value exactly, so each product of the logits q . key and of the weights' sum over the keys is fp32's
exact product, summed in fp32: fp32's result in another summation order, not bf16's. A row's bits depend only on
its own inputs and the shapes (H, d, W, k): the runs are fixed by the shapes, folded in a fixed order, no atomics;
rows are launched in chunks that bound the scratch (`max_scratch`), and keys are read from the packed rows or
their decoded tables, neither of which can change them.

Tolerance: a few 1e-6 of the largest output against float64 and the torch stage when logits reach ~50 (fp32's
rounding of the logits; then the online softmax's rescaling and the summation order against torch's two-pass
softmax and bmm; tl.exp is ex2.approx on a GPU): the tests hold it to 4e-6 of float64 (1e-5 at Flash shapes).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from tfc.kernels.dsv41.attend_keys import (
    AttendConfig,
    decoded_table,
    gathered_keys,
    gathers,
    predecodes,
    read_keys,
)
from tfc.kernels.dsv41.stage_tl import negate, rotate
from tfc.kernels.exl3.tl import INTERPRET

__all__ = ["AttendConfig", "attend_rows", "blocks"]

# The interpreter multiplies bf16 tensors as their raw 16-bit words, so there the pieces are widened to fp32 first
# (the same exact products; its sums are numpy's either way).
_WIDEN = tl.constexpr(INTERPRET)


def blocks(
    head_dim: int, decoded: bool = False, config: AttendConfig = AttendConfig()
) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_K, num_warps) for a shape: config's heads a program and keys a block; its warps, by default
    8 at d > 256 but from decoded or gathered tables (`predecodes`, `gathers`), whose keys take fewer registers."""
    warps = config.num_warps or (8 if head_dim > 256 and not decoded else 4)
    return config.heads_a_program, config.keys_a_block, warps


def runs(window: int, entries: int, block_k: int, split_blocks: int) -> tuple[int, int]:
    """(window runs, entry runs) of split_blocks * block_k keys each."""
    keys = split_blocks * block_k
    return triton.cdiv(window, keys), triton.cdiv(entries, keys)


@triton.jit
def _split3(x):
    """fp32 x as three bf16 pieces (hi, mid, lo) whose sum is x exactly: each the top 8 significant bits of
    what is left, cut by a mask (truncation, so no rounding mode matters and the interpreter gives the same)."""
    hi = (x.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
    rest = x - hi
    mid = (rest.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
    return hi.to(tl.bfloat16), mid.to(tl.bfloat16), (rest - mid).to(tl.bfloat16)


@triton.jit
def _mma(a, b, acc):
    """acc + a @ b of bf16 a, b with fp32 sums (widened to fp32 first where _WIDEN)."""
    if _WIDEN:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit
def _dot3(a_hi, a_mid, a_lo, b, acc):
    """acc + (a_hi + a_mid + a_lo) @ b on the matrix units (bf16 products are exact in fp32), smallest piece
    first."""
    return _mma(a_hi, b, _mma(a_mid, b, _mma(a_lo, b, acc)))


@triton.jit
def _step(q_hi, q_mid, q_lo, kv, ok, m, den, acc, scale, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr):
    """A key block (keys kv bf16 [BLOCK_K, D], exact: attend_keys) into the online softmax (m, den, acc), both
    products on the matrix units, the query and the weights in three pieces each."""
    s = _dot3(q_hi, q_mid, q_lo, tl.trans(kv), tl.zeros([BLOCK_H, BLOCK_K], tl.float32))
    s = tl.where(ok[None, :], s * scale, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    alpha = tl.exp(m - m_new)
    p = tl.exp(s - m_new[:, None])
    den = den * alpha + tl.sum(p, axis=1)
    p_hi, p_mid, p_lo = _split3(p)
    acc = _dot3(p_hi, p_mid, p_lo, kv, acc * alpha[:, None])
    return m_new, den, acc


@triton.jit
def _run(keys_ptr, idx_ptr, ok_ptr, s_keys, s_idx_r, s_idx_k, s_ok_r, s_ok_k, r, first, q_hi, q_mid, q_lo, m, den,
         acc, scale, N: tl.constexpr, D: tl.constexpr, ENTRY: tl.constexpr, DECODED: tl.constexpr,
         BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr):  # fmt: skip
    """The SPLIT key blocks from key `first` of a row's N window keys (or entries, ENTRY) into (m, den, acc); none
    when no key of the run is there (its partials, the sink, 0, 0, are the very bits its loop would give)."""
    c = tl.arange(0, D)
    js = first + tl.arange(0, SPLIT * BLOCK_K)
    there = tl.load(ok_ptr + r * s_ok_r + js * s_ok_k, mask=js < N, other=0).to(tl.int32)
    for b in range(tl.where(tl.max(there) > 0, SPLIT, 0)):
        j = first + b * BLOCK_K + tl.arange(0, BLOCK_K)
        ok = tl.load(ok_ptr + r * s_ok_r + j * s_ok_k, mask=j < N, other=0) != 0
        row = tl.load(idx_ptr + r * s_idx_r + j * s_idx_k, mask=ok, other=0)
        kv = read_keys(keys_ptr, row, ok, c, s_keys, D, ENTRY, DECODED, tl.bfloat16)
        m, den, acc = _step(q_hi, q_mid, q_lo, kv, ok, m, den, acc, scale, BLOCK_H, BLOCK_K)
    return m, den, acc


@triton.jit
def _partial_kernel(q_ptr, ring_ptr, read_ptr, valid_ptr, sinks_ptr, ent_ptr, at_ptr, ok_ptr, pm_ptr, pd_ptr,
                    pa_ptr, sq_r, sq_h, s_ring, s_read_r, s_read_w, s_valid_r, s_valid_w, s_ent, s_at_r,
                    s_at_k, s_ok_r, s_ok_k, s_sink, scale, H: tl.constexpr, D: tl.constexpr, W: tl.constexpr,
                    KT: tl.constexpr, RW: tl.constexpr, NR: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, DECODED: tl.constexpr = False):  # fmt: skip
    """One run of SPLIT key blocks of one row for BLOCK_H heads: its (maximum, denominator, accumulator). A run
    with no key there reads no key: it stores the sink, 0, 0, the very bits its loop would give. DECODED: ring
    and entries are bf16 tables (attend_keys.decoded_table or gathered_keys), read instead of decoded."""
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    run = tl.program_id(2)
    hm = h < H
    c = tl.arange(0, D)
    qs = r * sq_r + h[:, None] * sq_h  # q's channels are unit-strided (attend_rows makes them so)
    m = tl.load(sinks_ptr + h * s_sink, mask=hm, other=0.0).to(tl.float32)  # the maximum starts at the sink
    den = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    q_hi, q_mid, q_lo = _split3(tl.load(q_ptr + qs + c[None, :], mask=hm[:, None], other=0.0))
    if run < RW:
        m, den, acc = _run(ring_ptr, read_ptr, valid_ptr, s_ring, s_read_r, s_read_w, s_valid_r, s_valid_w, r,
                           run * SPLIT * BLOCK_K, q_hi, q_mid, q_lo, m, den, acc, scale, W, D, False, DECODED,
                           BLOCK_H, BLOCK_K, SPLIT)  # fmt: skip
    else:
        m, den, acc = _run(ent_ptr, at_ptr, ok_ptr, s_ent, s_at_r, s_at_k, s_ok_r, s_ok_k, r,
                           (run - RW) * SPLIT * BLOCK_K, q_hi, q_mid, q_lo, m, den, acc, scale, KT, D, True,
                           DECODED, BLOCK_H, BLOCK_K, SPLIT)  # fmt: skip
    at = (r * NR + run) * H + h  # partials [rows, runs, H] and [rows, runs, H, D]
    tl.store(pm_ptr + at, m, mask=hm)
    tl.store(pd_ptr + at, den, mask=hm)
    tl.store(pa_ptr + at[:, None] * D + c[None, :], acc, mask=hm[:, None])


@triton.jit
def _fold_kernel(pm_ptr, pd_ptr, pa_ptr, sinks_ptr, cos_ptr, sin_ptr, out_ptr, s_sink, s_cos_r, s_cos_c,
                 s_sin_r, s_sin_c, so_r, so_h, H: tl.constexpr, D: tl.constexpr, HALF: tl.constexpr,
                 NR: tl.constexpr, BLOCK_H: tl.constexpr):  # fmt: skip
    """One row's runs folded in order into the sink's softmax, divided, the query's rope taken off."""
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = h < H
    c = tl.arange(0, D)
    m = tl.load(sinks_ptr + h * s_sink, mask=hm, other=0.0).to(tl.float32)
    den = tl.full([BLOCK_H], 1.0, tl.float32)  # exp(sink - m)
    acc = tl.zeros([BLOCK_H, D], tl.float32)
    for run in range(NR):
        at = (r * NR + run) * H + h
        m_run = tl.load(pm_ptr + at, mask=hm, other=0.0)
        den_run = tl.load(pd_ptr + at, mask=hm, other=0.0)
        acc_run = tl.load(pa_ptr + at[:, None] * D + c[None, :], mask=hm[:, None], other=0.0)
        m_new = tl.maximum(m, m_run)
        alpha, beta = tl.exp(m - m_new), tl.exp(m_run - m_new)
        den = den * alpha + den_run * beta
        acc = acc * alpha[:, None] + acc_run * beta[:, None]
        m = m_new
    out = acc / den[:, None]
    even, odd = tl.split(tl.reshape(out, [BLOCK_H, D // 2, 2]))
    pair = tl.arange(0, D // 2) - (D // 2 - HALF)  # the pair's index in the rope slice (negative: no rope)
    rope = pair >= 0
    cos = tl.load(cos_ptr + r * s_cos_r + pair * s_cos_c, mask=rope, other=1.0)
    sin = tl.load(sin_ptr + r * s_sin_r + pair * s_sin_c, mask=rope, other=0.0)
    rot_even, rot_odd = rotate(even, odd, cos[None, :], negate(sin)[None, :])  # the conjugate rotation
    even = tl.where(rope[None, :], rot_even, even)
    odd = tl.where(rope[None, :], rot_odd, odd)
    out = tl.reshape(tl.join(even, odd), [BLOCK_H, D])
    tl.store(out_ptr + r * so_r + h[:, None] * so_h + c[None, :], out, mask=hm[:, None])


def _check(q, ring, read, valid, sinks, cos, sin, entries, at, ok) -> None:
    """ValueError (one line) for what the kernel does not take."""
    if q.dim() != 3 or q.dtype != torch.float32:
        raise ValueError(f"attend_rows: q must be fp32 [R, H, d], got {q.dtype} {tuple(q.shape)}")
    rows, heads, d = q.shape
    if d < 32 or d & (d - 1):
        raise ValueError(f"attend_rows: head_dim must be a power of two >= 32, got {d}")
    if ring.dtype != torch.uint8 or ring.dim() != 2 or ring.shape[1] != d + d // 32 or ring.stride(1) != 1:
        raise ValueError(
            f"attend_rows: ring must be uint8 [N, {d + d // 32}] rows, got {ring.dtype} {tuple(ring.shape)}"
        )
    if read.dtype != torch.int64 or read.dim() != 2 or read.shape[0] != rows or valid.shape != read.shape:
        raise ValueError(f"attend_rows: read must be int64 [R, W] and valid bool of its shape, got "
                         f"{read.dtype} {tuple(read.shape)}, {tuple(valid.shape)}")  # fmt: skip
    if valid.dtype != torch.bool or read.shape[1] < 1:
        raise ValueError(
            f"attend_rows: valid must be bool [R, W >= 1], got {valid.dtype} {tuple(valid.shape)}"
        )
    if not sinks.dtype.is_floating_point or sinks.shape != (heads,):
        raise ValueError(f"attend_rows: sinks must be float [{heads}], got {sinks.dtype} "
                         f"{tuple(sinks.shape)}")  # fmt: skip
    half = cos.shape[-1] if cos.dim() == 2 else -1
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[0] != rows or not 0 < 2 * half <= d:
        raise ValueError(
            f"attend_rows: cos, sin must be [R, <= d/2], got {tuple(cos.shape)}, {tuple(sin.shape)}"
        )
    if cos.dtype != torch.float32 or sin.dtype != torch.float32:
        raise ValueError(f"attend_rows: cos, sin must be fp32, got {cos.dtype}, {sin.dtype}")
    if entries is None:
        if at is not None or ok is not None:
            raise ValueError("attend_rows: at and ok come with entries")
        return
    n = d // 2 + d // 16
    if entries.dtype != torch.uint8 or entries.dim() != 2 or entries.shape[1] != n or entries.stride(1) != 1:
        raise ValueError(
            f"attend_rows: entries must be uint8 [M, {n}], got {entries.dtype} {tuple(entries.shape)}"
        )
    if at is None or ok is None or at.dtype != torch.int64 or at.dim() != 2 or at.shape[0] != rows:
        raise ValueError("attend_rows: at must be int64 [R, k] with ok bool of its shape")
    if ok.dtype != torch.bool or ok.shape != at.shape or at.shape[1] < 1:
        raise ValueError(f"attend_rows: ok must be bool [R, k >= 1] as at, got {ok.dtype} {tuple(ok.shape)}")


def attend_rows(q, ring, read, valid, sinks, cos, sin, entries=None, at=None, ok=None, grid=None,
                config: AttendConfig = AttendConfig()) -> torch.Tensor:  # fmt: skip
    """The torch stage's result fp32 [R, H, d]: each row's window keys (and entries) decoded and attended, the key
    tables decoded to bf16 once first where `predecodes`, else each row's own keys where `gathers` (the same keys
    every way, so the same bits)."""
    _check(q, ring, read, valid, sinks, cos, sin, entries, at, ok)
    rows, heads, d = q.shape
    out = torch.empty((rows, heads, d), dtype=torch.float32, device=q.device)
    if rows == 0:
        return out
    split_blocks = config.split_blocks
    if split_blocks < 1 or split_blocks & (split_blocks - 1):  # a run's keys are one tl.arange
        raise ValueError(f"attend_rows: split_blocks must be a power of two, got {split_blocks}")
    if entries is None:  # no entry runs (KT = 0): the pointers are never read
        entries, at, ok = ring, read, valid
        kt = 0
    else:
        kt = at.shape[1]
    window = read.shape[1]
    table_rows = ring.shape[0] + (entries.shape[0] if kt else 0)
    hb = triton.cdiv(heads, config.heads_a_program)
    decoded = predecodes(rows, hb, window + kt, table_rows, d, config)
    gather = gathers(rows, window + kt, d, decoded, config)
    block_h, block_k, warps = blocks(d, decoded or gather, config)
    fold_warps = blocks(d, decoded, config)[2]  # the fold reads partials, whatever the runs' keys
    rw, re = runs(window, kt, block_k, split_blocks)
    nr = rw + re
    valid8, ok8 = valid.view(torch.uint8), ok.view(torch.uint8)
    q = q if q.stride(2) == 1 else q.contiguous()
    chunk = max(1, config.max_scratch // (nr * heads * (d + 2) * 4))
    if decoded:
        ring = decoded_table(ring, d, False, config)
        entries = decoded_table(entries, d, True, config) if kt else ring
    for lo in range(0, rows, chunk):  # rows are independent: the chunking bounds the scratch, not the bits
        hi = min(rows, lo + chunk)
        part_m = torch.empty((hi - lo, nr, heads), dtype=torch.float32, device=q.device)
        part_d = torch.empty_like(part_m)
        part_a = torch.empty((hi - lo, nr, heads, d), dtype=torch.float32, device=q.device)
        keys_w, keys_e, rd, at_c = ring, entries, read[lo:hi], at[lo:hi]
        if gather:  # the chunk's own keys, decoded once; read by their positions in it
            keys_w, rd, at_c = gathered_keys(
                ring, rd, valid8[lo:hi], entries if kt else None, at_c, ok8[lo:hi], d, config
            )
            keys_e, at_c = keys_w, at_c if kt else rd
        _partial_kernel[(hi - lo, hb, nr)](
            q[lo:hi], keys_w, rd, valid8[lo:hi], sinks, keys_e, at_c, ok8[lo:hi], part_m, part_d,
            part_a, q.stride(0), q.stride(1), keys_w.stride(0), rd.stride(0), rd.stride(1),
            valid8.stride(0), valid8.stride(1), keys_e.stride(0), at_c.stride(0), at_c.stride(1), ok8.stride(0),
            ok8.stride(1), sinks.stride(0),
            d**-0.5, H=heads, D=d, W=window, KT=kt, RW=rw, NR=nr, BLOCK_H=block_h, BLOCK_K=block_k,
            SPLIT=split_blocks, DECODED=decoded or gather, num_warps=warps, num_stages=config.stages,
        )  # fmt: skip
        _fold_kernel[(hi - lo, hb)](
            part_m, part_d, part_a, sinks, cos[lo:hi], sin[lo:hi], out[lo:hi], sinks.stride(0),
            cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1), out.stride(0), out.stride(1),
            H=heads, D=d, HALF=cos.shape[-1], NR=nr, BLOCK_H=block_h, num_warps=fold_warps,
        )  # fmt: skip
    return out
