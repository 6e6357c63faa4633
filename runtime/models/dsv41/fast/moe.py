"""Fast DeepSeek-V4.1 MoE of one step: the sqrt-softplus noaux_tc router in fp32, experts through the MoE kernel.

Router (runtime/models/dsv41/moe.py `route`): scores = sqrt(softplus(x @ gate^T)), the top-k of scores + bias by
a stable sort (ties to the lower expert id), weights = the picked scores normalised, times routed_scaling. The
gate weight stays bf16 as stored: x is split into three bf16 parts (x = hi + mid + lo to within fp32 rounding)
that go through one bf16 x bf16 -> fp32 product, and the three row blocks are summed in order. The experts
(clamped SwiGLU, shared expert last) run on the step's first `live` rows only: padding rows pick no experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def router_logits(ops, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [R, D] fp32 @ weight [E, D]^T in fp32 accuracy, reading the weight as stored."""
    if weight.dtype == torch.float32:
        return x @ weight.T
    hi = x.to(weight.dtype)
    mid = (x - hi.float()).to(weight.dtype)
    lo = (x - hi.float() - mid.float()).to(weight.dtype)
    rows = x.shape[0]
    prod = ops.mm_bf16(torch.cat((hi, mid, lo)), weight)
    return (prod[:rows] + prod[rows : 2 * rows]) + prod[2 * rows :]


def route(ops, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float,
          normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(weights [R, k], expert ids [R, k]) of the rows x [R, D]."""
    scores = F.softplus(router_logits(ops, x, weight)).sqrt()
    ids = torch.sort(scores + bias, dim=-1, descending=True, stable=True).indices[..., :top_k]
    picked = scores.gather(-1, ids)
    if normalise and top_k > 1:
        picked = picked / (picked.sum(-1, keepdim=True) + 1e-20)
    return picked * scaling, ids


def moe(f, layer: int, x: torch.Tensor, live: int) -> torch.Tensor:
    """The MoE block on the step's rows x [R, D]; rows from `live` on come back as zeros."""
    cfg, w = f.cfg, f.weights
    p = f"layers.{layer}.ffn"
    weights, ids = route(f.ops, x, w.native(f"{p}.gate.weight"), w.native(f"{p}.gate.bias"),
                         cfg.num_experts_per_tok, cfg.routed_scaling_factor, cfg.norm_topk_prob)  # fmt: skip
    if f.routes is not None:
        f.routes.append((layer, ids[:live].clone()))
    y = f.ops.moe(x[:live], ids[:live], weights[:live], w.experts(f"layers.{layer}"), cfg.swiglu_limit)
    if live < x.shape[0]:
        y = torch.cat((y, torch.zeros(x.shape[0] - live, y.shape[1], dtype=y.dtype, device=y.device)))
    return y
