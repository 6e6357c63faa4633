"""Manifold-constrained hyper-connections (mHC) of DeepSeek-V4.1: hc_mult residual streams per token.

References: huggingface/transformers deepseek_v41 modeling at 0a2080b4 (`DeepseekV41DecoderLayer.hc_mixes`,
`hc_collapse`, `hc_expand`, the model's one-hot first `pre` and final collapse) and turboderp-org/exllamav3
exllamav3/modules/hyperconnections.py at 0315f22c (`HyperConnection.mix`, DeepSeek-V4; its
architecture/deepseek_v41.py at 13b31a6b also collapses each site with the previous site's weights). One projection of the RMS-
normalised flattened streams gives pre (hc), post (hc) and comb (hc x hc):

    pre  = sigmoid(s0 * m[:hc] + b[:hc]) + hc_eps
    post = alpha * sigmoid(s1 * m[hc:2hc] + b[hc:2hc])                      (alpha = hc_post_alpha = 2)
    comb = Sinkhorn(softmax_rows(s2 * m[2hc:] + b[2hc:]) + hc_eps)          (columns first, iters in total)

V4.1 differs from V4 in who uses `pre`: a site collapses the streams with the `pre` of the PREVIOUS site
(the first attention site with a one-hot on stream 0, the final head with the last FFN site's).
The site update is  streams_k <- post_k * y + sum_j comb[j, k] * streams_j.
"""

from __future__ import annotations

import torch
from tfc.runtime.models.dsv41.reference.numerics import wide


@wide
def hc_mix(
    streams: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    iters: int,
    **mix: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(pre [..., hc], post [..., hc], comb [..., hc, hc]) of one site from streams [..., hc, D]; `mix`: the
    norm_eps, hc_eps (and post_alpha) of hc_mix_logits."""
    pre, post, logits = hc_mix_logits.__wrapped__(streams, fn, scale, base, **mix)
    return pre, post, sinkhorn(logits, iters, mix["hc_eps"])


@wide
def hc_mix_logits(
    streams: torch.Tensor,
    fn: torch.Tensor,
    scale: torch.Tensor,
    base: torch.Tensor,
    *,
    norm_eps: float,
    hc_eps: float,
    post_alpha: float = 2.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """hc_mix before its Sinkhorn: (pre, post, the comb's logits [..., hc, hc])."""
    hc = streams.shape[-2]
    flat = streams.flatten(-2)
    flat = flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + norm_eps)
    mixes = flat @ fn.T
    pre = torch.sigmoid(mixes[..., :hc] * scale[0] + base[:hc]) + hc_eps
    post = post_alpha * torch.sigmoid(mixes[..., hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    logits = (mixes[..., 2 * hc :] * scale[2] + base[2 * hc :]).unflatten(-1, (hc, hc))
    return pre, post, logits


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """comb [..., hc, hc] = Sinkhorn(softmax_rows(logits) + eps): columns first, then rows and columns, iters in all."""
    comb = torch.softmax(logits, dim=-1) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return comb


@wide
def hc_collapse(streams: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """One sublayer input [..., D] = sum_i pre_i * stream_i."""
    return (pre.unsqueeze(-1) * streams).sum(-2)


@wide
def hc_expand(
    y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
) -> torch.Tensor:
    """New streams [..., hc, D]: post_k * y + sum_j comb[j, k] * residual_j."""
    return post.unsqueeze(-1) * y.unsqueeze(-2) + comb.transpose(-1, -2) @ residual


def first_pre(
    shape: tuple[int, ...], hc: int, dtype: torch.dtype, device: torch.device | str
) -> torch.Tensor:
    """The one-hot `pre` of the first site: it collapses stream 0 (all streams start equal)."""
    pre = torch.zeros(*shape, hc, dtype=dtype, device=device)
    pre[..., 0] = 1.0
    return pre
