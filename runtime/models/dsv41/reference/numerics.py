"""Batch-invariant arithmetic of the DeepSeek-V4.1 forward: activations in the model's dtype, modules in float64.

A token's result must not depend on how many rows share a call or where its sequence was cut into chunks.
fp32 kernels do not give that: a GEMM sums in another order than a GEMV, softmax and attention run over
more or fewer (masked) keys, a vectorised exp or cos differs from its scalar tail by an ulp, so one token
moves by ~1e-7 between batch shapes, and the model's own FP8/FP4 cache quantisers now and then turn such a
move into a whole quantisation step (logits then drift by up to ~1). So each module (norm, mHC mix /
collapse / expand, attention, MoE, Engram, head) computes in float64 and rounds its result to the
activation dtype: float64 order noise is ~1e-16 relative, so the rounded fp32 bits agree unless a float64
result lies within that noise of an fp32 rounding midpoint (a chance of order 1e-8 per value, and a
flipped ulp moves the logits by a few fp32 ulps). Weights stay stored in the model's dtype and are widened
per call; float64 models are unchanged (every conversion is a no-op).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

import torch

WIDE = torch.float64

P = ParamSpec("P")
R = TypeVar("R")


def _is_float(a: Any) -> bool:
    return isinstance(a, torch.Tensor) and a.is_floating_point()


def _widen(a: Any) -> Any:
    return a.to(WIDE) if _is_float(a) else a


def _narrow(out: Any, dtype: torch.dtype) -> Any:
    if _is_float(out):
        return out.to(dtype)
    if isinstance(out, tuple):
        return tuple(_narrow(o, dtype) for o in out)
    return out


def wide(fn: Callable[P, R]) -> Callable[P, R]:
    """Run fn on float64 copies of its floating tensor arguments; round its tensor results to the first one's dtype."""

    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        first = next((a for a in (*args, *kwargs.values()) if _is_float(a)), None)
        out = fn(*(_widen(a) for a in args), **{k: _widen(v) for k, v in kwargs.items()})
        return out if first is None else _narrow(out, first.dtype)

    return run


@wide
def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w (w dense [in, out]), summed in float64, in x's dtype."""
    return x @ w


# -- tensor-parallel exactness (docs/parallel.md): the same bits at TP=1, 2, 4 and 8 ---------------------------

BLOCK = 128  # TP splits fall on 128-value blocks (the EXL3 Hadamard blocks)
FIXED_HI = 2.0**32  # a fixed-point value is hi * 2**-32 + lo * 2**-64, hi and lo int64 words
FIXED_RANGE = 2.0**20  # |partial| bound: 2**20 * 2**32 leaves room to add 2**11 such partials in an int64


class FixedPointRange(ValueError):
    """A row-parallel partial sum outside the fixed-point range (or not finite)."""


def _blocks(extent: int) -> list[tuple[int, int]]:
    """[start, stop) of each 128-value block of a dimension (the last one short when it does not divide)."""
    return [(lo, min(lo + BLOCK, extent)) for lo in range(0, extent, BLOCK)]


def _block_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b[i] for every block i of b [nb, k, n] (a [m, k] or [nb, m, k]), each block one GEMM of one shape.

    MKL runs a batched matmul as one GEMM per batch element (tests check that a sub-batch gives the same bits);
    cuBLAS may pick another algorithm for another batch count, so on CUDA the blocks run one call each."""
    if not a.is_cuda:
        return torch.matmul(a, b)
    return torch.stack([(a if a.dim() == 2 else a[i]) @ b[i] for i in range(b.shape[0])])


@wide
def column_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w (w [in, out]) one 128-column block at a time, in float64: any 128-aligned column range of w gives
    the bits the whole w gives for those columns (one GEMM's bits depend on its width)."""
    k, n = w.shape
    full = n - n % BLOCK
    out = []
    if full:
        wb = w[:, :full].reshape(k, full // BLOCK, BLOCK).transpose(0, 1).contiguous()  # [nb, k, 128]
        out.append(_block_matmul(x, wb).transpose(0, 1).reshape(x.shape[0], full))
    if n > full:
        out.append(x @ w[:, full:].contiguous())
    return torch.cat(out, dim=-1) if len(out) > 1 else out[0]


def row_partials(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    """The float64 products x[:, b] @ w[b] of every 128-row block b of w [in, out]: what a TP split adds."""
    x, w = x.to(WIDE), w.to(WIDE)
    k, n = w.shape
    full = k - k % BLOCK
    out = []
    if full:
        xb = x[:, :full].reshape(x.shape[0], full // BLOCK, BLOCK).transpose(0, 1).contiguous()
        out.extend(_block_matmul(xb, w[:full].reshape(full // BLOCK, BLOCK, n)).unbind(0))
    if k > full:
        out.append(x[:, full:].contiguous() @ w[full:].contiguous())
    return out


def to_fixed(p: torch.Tensor) -> torch.Tensor:
    """int64 [2, *p.shape]: p (float64) rounded to a multiple of 2**-64, as hi * 2**-32 + lo * 2**-64, lo in [0, 2**32]."""
    if p.numel() and not bool((p.abs() < FIXED_RANGE).all()):
        raise FixedPointRange(
            f"a row-parallel partial sum is outside +-2**20 (max {float(p.abs().max()):.3g})"
        )
    a = p * FIXED_HI  # exact: a power-of-two scale
    hi = torch.floor(a)
    lo = torch.round((a - hi) * FIXED_HI)  # a - hi is exact in [0, 1)
    return torch.stack((hi, lo)).to(torch.int64)


def from_fixed(acc: torch.Tensor) -> torch.Tensor:
    """The float64 value of a fixed-point sum int64 [2, ...] (carries normalised first; one rounding)."""
    hi, lo = acc[0] + torch.div(acc[1], 1 << 32, rounding_mode="floor"), torch.remainder(acc[1], 1 << 32)
    return hi.to(WIDE) / FIXED_HI + lo.to(WIDE) / (FIXED_HI * FIXED_HI)


def fixed_sum(partials: list[torch.Tensor]) -> torch.Tensor:
    """int64 [2, ...]: the exact sum of the partials' fixed-point values (any grouping, any order: the same bits)."""
    return torch.stack([to_fixed(p) for p in partials]).sum(0)
