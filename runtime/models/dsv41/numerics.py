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
