"""A few rows by a stored matrix in one launch: y [R, N] fp32 = a [R, K] @ w [N, K]^T, for the decode step's MoE
router and the indexer's `weights_proj`. bf16 / fp16 run on the matrix units (exact products, fp32 sums), fp32 as
IEEE FMA (`input_precision="ieee"`, so no TF32). The router's fp32 input goes in whole (`parts`): the kernel cuts
it into router_pick.split3's three bf16 parts, multiplies each by the bf16 gate and adds the three sums, which
is what split3, this product and the pick's sum of the parts' rows did in three launches. Under the CPU
interpreter 16-bit inputs are multiplied in fp32 (their products exact there too), bf16 read as its bits.

cuBLAS runs these skinny products as a split-K GEMM and a second `splitKreduce` launch. Here a program takes
ROWS rows, BN columns and one of SPLIT ranges of k, stores its partial, and the last program of its (row block,
column block) to arrive (an arrival counter the kernel leaves zeroed) sums the SPLIT partials in split order.
The blocks and the split follow (K, N) alone and every program holds ROWS rows, padding rows zero, so a row's bits
depend on neither R nor the other rows. Launches only (CUDA-graph safe); launches that may run at once on two
streams must not share the counter buffer (exl3_launch.counters). In the decode step this took longer than the
cuBLAS launches it replaces (each block's last program sums every split alone: benchmarks/decode.md, variants run
17), so ops.ROWS_MM leaves it off.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3_launch import counters
from tfc.kernels.exl3_tl import INTERPRET, release_fence
from tfc.kernels.router_pick import _round_bf16

ROWS = 64  # rows a program (the mma's M; padding rows are zeros)
BK = 64  # k a step
MAX_BN = 64  # columns a program
PROGRAMS = 128  # programs the split aims at (about one wave of an H100 / H200)
MIN_K_A_SPLIT = 256  # k a split range holds at least


@triton.jit
def _dot(a, w, acc, MMA: tl.constexpr):
    """acc + a @ w: on the matrix units in bf16 / fp16 (MMA: a and w rounded to w's dtype; exact for split parts),
    else fp32 IEEE FMA."""
    if MMA:
        return tl.dot(a.to(w.dtype), w, acc)
    return tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")


@triton.jit
def _sum_parts(part, SPLIT: tl.constexpr, MP: tl.constexpr, BN: tl.constexpr, keep):
    """The sum of SPLIT [MP, BN] partials from `part` on, in split order."""
    y = tl.zeros([MP, BN], dtype=tl.float32)
    for p in range(SPLIT):
        y += tl.load(part + p * MP * BN, mask=keep, other=0.0, cache_modifier=".cg")
    return y


@triton.jit
def _rows_mm_kernel(a_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, R, N, K, K_PER, stride_a, stride_w, stride_y,
                    SPLIT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MP: tl.constexpr,
                    MMA: tl.constexpr, BF16_BITS: tl.constexpr, PARTS: tl.constexpr):  # fmt: skip
    """One (column block, k range, row block): its partial; the last of a block's SPLIT sums them in order.
    PARTS 3: a is fp32 x, multiplied as its three bf16 parts (router_pick.split3's), each part's products summed
    apart and the three sums added (hi + mid) + lo, as the router's pick adds split3's three row blocks."""
    pid_n, s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * MP + tl.arange(0, MP)
    cols = pid_n * BN + tl.arange(0, BN)
    kk = tl.arange(0, BK)
    row_ok, col_ok = rows < R, cols < N
    acc = tl.zeros([MP, BN], dtype=tl.float32)
    acc_mid = tl.zeros([MP, BN], dtype=tl.float32)
    acc_lo = tl.zeros([MP, BN], dtype=tl.float32)
    k0 = s * K_PER
    for k in range(k0, k0 + K_PER, BK):
        ks = k + kk
        a = tl.load(a_ptr + rows[:, None].to(tl.int64) * stride_a + ks[None, :],
                    mask=row_ok[:, None] & (ks[None, :] < K), other=0.0)  # fmt: skip
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * stride_w + ks[:, None],
                    mask=col_ok[None, :] & (ks[:, None] < K), other=0.0)  # fmt: skip
        if BF16_BITS:  # bf16 read as its bits (the interpreter has no bf16 loads): exact in fp32
            w = ((w.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
            if PARTS == 1:
                a = ((a.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
        if PARTS == 3:
            hi = _round_bf16(a).to(tl.float32, bitcast=True)
            d = a - hi
            mid = _round_bf16(d).to(tl.float32, bitcast=True)
            acc = _dot(hi, w, acc, MMA)
            acc_mid = _dot(mid, w, acc_mid, MMA)
            acc_lo = _dot(_round_bf16(d - mid).to(tl.float32, bitcast=True), w, acc_lo, MMA)
        else:
            acc = _dot(a, w, acc, MMA)
    out = y_ptr + rows[:, None].to(tl.int64) * stride_y + cols[None, :]
    keep = row_ok[:, None] & col_ok[None, :]
    if SPLIT == 1:
        if PARTS == 3:
            acc = (acc + acc_mid) + acc_lo
        tl.store(out, acc, mask=keep)
    else:
        block = pid_m * tl.num_programs(0) + pid_n
        at = tl.arange(0, MP)[:, None] * BN + tl.arange(0, BN)[None, :]
        part = ws_ptr + block.to(tl.int64) * PARTS * SPLIT * MP * BN + at
        tl.store(part + s * MP * BN, acc, mask=keep)
        if PARTS == 3:
            tl.store(part + (SPLIT + s) * MP * BN, acc_mid, mask=keep)
            tl.store(part + (2 * SPLIT + s) * MP * BN, acc_lo, mask=keep)
        release_fence()
        if tl.atomic_add(cnt_ptr + block, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
            y = _sum_parts(part, SPLIT, MP, BN, keep)
            if PARTS == 3:
                y = (y + _sum_parts(part + SPLIT * MP * BN, SPLIT, MP, BN, keep)) + _sum_parts(
                    part + 2 * SPLIT * MP * BN, SPLIT, MP, BN, keep
                )
            tl.store(out, y, mask=keep)
            tl.atomic_xchg(cnt_ptr + block, 0)


def plan(k: int, n: int) -> tuple[int, int, int]:
    """(BN, SPLIT, k a split range) of a [*, k] @ [n, k]^T product: set by the shape alone."""
    bn = min(MAX_BN, max(16, triton.next_power_of_2(n)))
    blocks = triton.cdiv(n, bn)
    split = 1
    while split * 2 * blocks <= PROGRAMS and k // (split * 2) >= MIN_K_A_SPLIT:
        split *= 2
    k_per = triton.cdiv(triton.cdiv(k, split), BK) * BK
    return bn, triton.cdiv(k, k_per), k_per


def rows_mm(a: torch.Tensor, w: torch.Tensor, parts: bool = False) -> torch.Tensor:
    """fp32 [R, N] = a [R, K] @ w [N, K]^T, a and w both bf16 (exact products, fp32 sums) or both fp32 (FMA);
    `parts`: a fp32 by w bf16 as a's three bf16 parts, each part's product summed apart, then added (hi + mid) +
    lo: the bits of rows_mm(router_pick.split3(a, bf16), w)'s three row blocks added so."""
    want = (torch.float32, torch.bfloat16) if parts else (w.dtype, w.dtype)
    if (a.dtype, w.dtype) != want or w.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"rows_mm takes bf16, fp16 or fp32 of one dtype (parts: fp32 by bf16), not {a.dtype} by "
                        f"{w.dtype}")  # fmt: skip
    a, w = a.contiguous(), w.contiguous()
    (r, k), n = a.shape, w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"rows_mm: a is [{r}, {k}] but w is {list(w.shape)}")
    bn, split, k_per = plan(k, n)
    grid = (triton.cdiv(n, bn), split, triton.cdiv(r, ROWS))
    y = torch.empty((r, n), dtype=torch.float32, device=a.device)
    blocks, count = grid[0] * grid[2], 3 if parts else 1
    ws = torch.empty((blocks * count * split * ROWS * bn,) if split > 1 else (1,), dtype=torch.float32,
                     device=a.device)  # fmt: skip
    cnt = counters(a.device, blocks) if split > 1 else ws
    bits = INTERPRET and w.dtype == torch.bfloat16
    if bits:
        a, w = a if parts else a.view(torch.int16), w.view(torch.int16)
    _rows_mm_kernel[grid](a, w, y, ws, cnt, r, n, k, k_per, a.stride(0), w.stride(0), y.stride(0),
                          SPLIT=split, BN=bn, BK=BK, MP=ROWS, MMA=want[1] != torch.float32 and not INTERPRET,
                          BF16_BITS=bits, PARTS=count, num_warps=8 if parts else 4)  # fmt: skip
    return y
