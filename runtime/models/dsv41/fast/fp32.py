"""The reference's device-agnostic maths run in fp32: its float64 wrappers (numerics.wide) taken off.

rms_norm, and the mHC mix, collapse and expand are plain torch ops of fixed shape; the fast forward calls the
very code the reference runs, only on fp32 tensors (as stage kernels on a GPU: stages.py). The mix's Sinkhorn is
the exception on a GPU: one Triton launch a site (kernels/dsv41/mhc_sinkhorn.py) where the loop takes two an iteration.
`fixed_sum` sums along an axis by halving, an order that no kernel choice can change.
"""

from __future__ import annotations

import torch
from tfc.runtime.models.dsv41.fast.stages import fused, stage_kernel
from tfc.runtime.models.dsv41.reference import csa, mhc

plain_rms_norm = csa.rms_norm.__wrapped__
rms_norm = fused(plain_rms_norm, kernel="tfc.kernels.dsv41.mhc_stages:rms_norm")
hc_mix_logits = fused(mhc.hc_mix_logits.__wrapped__, kernel="tfc.kernels.dsv41.mhc_stages:hc_mix_logits")
hc_expand = fused(mhc.hc_expand.__wrapped__, kernel="tfc.kernels.dsv41.mhc_stages:hc_expand")
hc_collapse = mhc.hc_collapse.__wrapped__
first_pre = mhc.first_pre


@fused(kernel="tfc.kernels.dsv41.mhc_stages:collapse_norm")
def collapse_norm(streams: torch.Tensor, pre: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(sum_i pre_i * stream_i): a site's input."""
    return plain_rms_norm(hc_collapse(streams, pre), weight, eps)


def stream_tap(streams: torch.Tensor, out: torch.Tensor) -> None:
    """out [R, D] = the float64 mean of streams [R, S, D] over S rounded to fp32 (the reference's `capture`): one
    kernel where stage kernels run (kernels/dsv41/hidden_tap.py, torch's bits), else as torch computes it."""
    kernel = stage_kernel("tfc.kernels.dsv41.hidden_tap:stream_mean_into", streams)
    if kernel is not None:
        kernel(streams, out)
    else:
        out.copy_(streams.to(torch.float64).mean(-2).to(torch.float32))


def hc_mix(streams: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, *, iters: int,
           **mix: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    """mhc.hc_mix in fp32: its logits as a fused stage, its Sinkhorn in one kernel on a GPU (the loop elsewhere)."""
    pre, post, logits = hc_mix_logits(streams, fn, scale, base, **mix)
    if logits.is_cuda:
        from tfc.kernels.dsv41.mhc_sinkhorn import sinkhorn as sinkhorn_kernel

        return pre, post, sinkhorn_kernel(logits, iters, mix["hc_eps"])
    return pre, post, mhc.sinkhorn(logits, iters, mix["hc_eps"])


def fixed_sum(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sum over `dim` as a tree of elementwise adds (first half + second half, an odd last one carried)."""
    n = t.shape[dim]
    while n > 1:
        half = n // 2
        pair = t.narrow(dim, 0, half) + t.narrow(dim, half, half)
        t = pair if n % 2 == 0 else torch.cat((pair, t.narrow(dim, n - 1, 1)), dim)
        n = t.shape[dim]
    return t.squeeze(dim)
