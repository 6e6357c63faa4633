"""The mHC mix's comb matrix in one launch: row softmax of the [hc, hc] logits, then Sinkhorn normalisation.

comb = softmax_rows(logits) + eps; comb /= column sums + eps; then (iters - 1) times rows, then columns
(runtime/models/dsv41/reference/mhc.py `sinkhorn`, the model's loop). Each program holds `SinkhornConfig.rows`
tokens' [hc, hc] matrices in registers and runs
every iteration there: one kernel a site where the eager loop (and torch.compile's code for it) launches two a
iteration. fp32 throughout; sums of hc values in the order the reduction tree takes (within an ulp of torch's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class SinkhornConfig:
    """Launch values of the Sinkhorn kernel (any of them gives the same bits)."""

    rows: int = 16  # tokens a program


@triton.jit
def _sinkhorn_kernel(logits_ptr, out_ptr, R, eps, ITERS: tl.constexpr, HC: tl.constexpr, ROWS: tl.constexpr):
    """out[r] = Sinkhorn(softmax_rows(logits[r]) + eps) for ROWS tokens r, each a row-major [HC, HC] matrix."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    i = tl.arange(0, HC)
    offs = r[:, None, None] * (HC * HC) + i[None, :, None] * HC + i[None, None, :]
    keep = r[:, None, None] < R
    x = tl.load(logits_ptr + offs, mask=keep, other=0.0).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=2)[:, :, None])
    c = e / tl.sum(e, axis=2)[:, :, None] + eps
    c = c / (tl.sum(c, axis=1)[:, None, :] + eps)
    for _ in tl.static_range(ITERS - 1):
        c = c / (tl.sum(c, axis=2)[:, :, None] + eps)
        c = c / (tl.sum(c, axis=1)[:, None, :] + eps)
    tl.store(out_ptr + offs, c, mask=keep)


def sinkhorn(
    logits: torch.Tensor, iters: int, eps: float, config: SinkhornConfig = SinkhornConfig()
) -> torch.Tensor:
    """comb [..., hc, hc] fp32 of the mix's logits [..., hc, hc] (hc a power of two)."""
    hc = logits.shape[-1]
    if logits.shape[-2] != hc or hc & (hc - 1) or iters < 1:
        raise ValueError(f"logits {tuple(logits.shape)} must end in [hc, hc], hc a power of two; iters >= 1")
    x = logits.float().contiguous()
    out = torch.empty_like(x)
    rows = x.numel() // (hc * hc)
    if rows:
        _sinkhorn_kernel[(triton.cdiv(rows, config.rows),)](
            x, out, rows, eps, ITERS=iters, HC=hc, ROWS=config.rows, num_warps=1
        )
    return out


__all__ = ["SinkhornConfig", "sinkhorn"]
