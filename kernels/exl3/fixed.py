"""Fixed-point partial sums for tensor-parallel exactness: fp32 block partials added as integer words.

A row-parallel product (wo_b, the experts' w2) is a sum over 128-row blocks; a TP rank adds its own blocks and
the all-reduce adds the ranks'. A float sum's bits depend on that grouping, an integer sum's do not. So each
block partial p (fp32) is rounded onto the grid of runtime/models/dsv41/reference/numerics.py, two int64 words
hi = floor(p * 2**32) and lo = round((p * 2**32 - hi) * 2**32) (p = hi * 2**-32 + lo * 2**-64), and the words
are summed as integers: exact in any grouping and order, so TP=1 and every world agree (docs/parallel.md).
The accumulator is int64 [2, rows, n] (the hi plane, then the lo plane); `fixed_value` turns it into fp32 once
every rank's words are in (carries normalised, one float64 rounding, then fp32).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

TWO32 = 4294967296.0


@triton.jit
def fixed_words(v):
    """(hi, lo) int64 words of fp32 values v on the 2**-64 grid (float64 steps, each exact but the last round)."""
    a = v.to(tl.float64) * 4294967296.0
    hi = tl.floor(a)
    lo = tl.floor((a - hi) * 4294967296.0 + 0.5)
    return hi.to(tl.int64), lo.to(tl.int64)


@triton.jit
def fixed_parts(src, nsum, part_stride):
    """(hi, lo) int64 [128] sums of the words of nsum fp32 [128] vectors part_stride apart (any order: exact)."""
    c = tl.arange(0, 128)
    hi = tl.zeros([128], dtype=tl.int64)
    lo = tl.zeros([128], dtype=tl.int64)
    for s in range(nsum):
        h, q = fixed_words(tl.load(src + s * part_stride + c, cache_modifier=".cg"))
        hi += h
        lo += q
    return hi, lo


@triton.jit
def _fixed_value_kernel(acc_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = i < n
    hi = tl.load(acc_ptr + i, mask=keep, other=0)
    lo = tl.load(acc_ptr + n + i, mask=keep, other=0)
    hi = hi + (lo >> 32)
    lo = lo & 4294967295
    v = hi.to(tl.float64) * (1.0 / 4294967296.0) + lo.to(tl.float64) * (1.0 / 18446744073709551616.0)
    tl.store(y_ptr + i, v.to(tl.float32), mask=keep)


def fixed_value(acc: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """fp32 [...] of a fixed-point sum int64 [2, ...] (numerics.from_fixed, rounded to fp32)."""
    if acc.dtype != torch.int64 or acc.shape[0] != 2 or not acc.is_contiguous():
        raise ValueError(
            f"a fixed-point sum is a contiguous int64 [2, ...], not {acc.dtype} {tuple(acc.shape)}"
        )
    y = out if out is not None else torch.empty(acc.shape[1:], dtype=torch.float32, device=acc.device)
    n = y.numel()
    _fixed_value_kernel[(triton.cdiv(n, 1024),)](acc, y, n, BLOCK=1024, num_warps=4)
    return y


def fixed_reference(p: torch.Tensor) -> torch.Tensor:
    """int64 [2, ...] words of fp32 partials p (fixed_words in torch, for tests)."""
    a = p.double() * TWO32
    hi = torch.floor(a)
    lo = torch.floor((a - hi) * TWO32 + 0.5)
    return torch.stack((hi, lo)).to(torch.int64)


__all__ = ["fixed_parts", "fixed_reference", "fixed_value", "fixed_words"]
