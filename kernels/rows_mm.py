"""A few rows by a stored matrix in one launch: y [R, N] fp32 = a [R, K] @ w [N, K]^T, for the decode step's MoE
router (its input's three bf16 parts by the bf16 gate: on the matrix units, exact products, fp32 sums) and the
indexer's `weights_proj` (fp32 by fp32: IEEE FMA, `input_precision="ieee"`, so no TF32). Under the CPU interpreter 16-bit inputs
are multiplied in fp32 (their products exact there too), bf16 read as its bits.

cuBLAS runs these skinny products as a split-K GEMM and a second `splitKreduce` launch. Here a program takes
ROWS rows, BN columns and one of SPLIT ranges of k, stores its partial, and the last program of its (row block,
column block) to arrive (an arrival counter the kernel leaves zeroed) sums the SPLIT partials in split order.
The blocks and the split follow (K, N) alone and every program holds ROWS rows, padding rows zero, so a row's bits
depend on neither R nor the other rows. Launches only (CUDA-graph safe); launches that may run at once on two
streams must not share the counter buffer (exl3_launch.counters).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3_launch import counters
from tfc.kernels.exl3_tl import INTERPRET, release_fence

ROWS = 64  # rows a program (the mma's M; padding rows are zeros)
BK = 64  # k a step
MAX_BN = 64  # columns a program
PROGRAMS = 128  # programs the split aims at (about one wave of an H100 / H200)
MIN_K_A_SPLIT = 256  # k a split range holds at least


@triton.jit
def _rows_mm_kernel(a_ptr, w_ptr, y_ptr, ws_ptr, cnt_ptr, R, N, K, K_PER, stride_a, stride_w, stride_y,
                    SPLIT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, MP: tl.constexpr,
                    MMA: tl.constexpr, BF16_BITS: tl.constexpr):  # fmt: skip
    """One (column block, k range, row block): its partial; the last of a block's SPLIT sums them in order."""
    pid_n, s, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rows = pid_m * MP + tl.arange(0, MP)
    cols = pid_n * BN + tl.arange(0, BN)
    kk = tl.arange(0, BK)
    row_ok, col_ok = rows < R, cols < N
    acc = tl.zeros([MP, BN], dtype=tl.float32)
    k0 = s * K_PER
    for k in range(k0, k0 + K_PER, BK):
        ks = k + kk
        a = tl.load(a_ptr + rows[:, None].to(tl.int64) * stride_a + ks[None, :],
                    mask=row_ok[:, None] & (ks[None, :] < K), other=0.0)  # fmt: skip
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * stride_w + ks[:, None],
                    mask=col_ok[None, :] & (ks[:, None] < K), other=0.0)  # fmt: skip
        if BF16_BITS:  # bf16 read as its bits (the interpreter has no bf16 loads): exact in fp32
            a = ((a.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
            w = ((w.to(tl.int32) & 0xFFFF) << 16).to(tl.float32, bitcast=True)
        if MMA:
            acc = tl.dot(a, w, acc)
        else:
            acc = tl.dot(a.to(tl.float32), w.to(tl.float32), acc, input_precision="ieee")
    out = y_ptr + rows[:, None].to(tl.int64) * stride_y + cols[None, :]
    keep = row_ok[:, None] & col_ok[None, :]
    if SPLIT == 1:
        tl.store(out, acc, mask=keep)
    else:
        block = pid_m * tl.num_programs(0) + pid_n
        part = (
            ws_ptr
            + block.to(tl.int64) * SPLIT * MP * BN
            + tl.arange(0, MP)[:, None] * BN
            + tl.arange(0, BN)[None, :]
        )
        tl.store(part + s * MP * BN, acc, mask=keep)
        release_fence()
        if tl.atomic_add(cnt_ptr + block, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
            y = tl.zeros([MP, BN], dtype=tl.float32)
            for p in range(SPLIT):
                y += tl.load(part + p * MP * BN, mask=keep, other=0.0, cache_modifier=".cg")
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


def rows_mm(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 [R, N] = a [R, K] @ w [N, K]^T, a and w both bf16 (exact products, fp32 sums) or both fp32 (FMA)."""
    if a.dtype != w.dtype or a.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"rows_mm takes bf16, fp16 or fp32 of one dtype, not {a.dtype} by {w.dtype}")
    a, w = a.contiguous(), w.contiguous()
    (r, k), n = a.shape, w.shape[0]
    if w.shape[1] != k:
        raise ValueError(f"rows_mm: a is [{r}, {k}] but w is {list(w.shape)}")
    bn, split, k_per = plan(k, n)
    grid = (triton.cdiv(n, bn), split, triton.cdiv(r, ROWS))
    y = torch.empty((r, n), dtype=torch.float32, device=a.device)
    blocks = grid[0] * grid[2]
    ws = torch.empty(
        (blocks * split * ROWS * bn,) if split > 1 else (1,), dtype=torch.float32, device=a.device
    )
    cnt = counters(a.device, blocks) if split > 1 else ws
    half = a.dtype != torch.float32
    bits = INTERPRET and a.dtype == torch.bfloat16
    if bits:
        a, w = a.view(torch.int16), w.view(torch.int16)
    _rows_mm_kernel[grid](a, w, y, ws, cnt, r, n, k, k_per, a.stride(0), w.stride(0), y.stride(0),
                          SPLIT=split, BN=bn, BK=BK, MP=ROWS, MMA=half and not INTERPRET, BF16_BITS=bits,
                          num_warps=4)  # fmt: skip
    return y
