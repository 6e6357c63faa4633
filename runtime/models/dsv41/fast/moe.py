"""Fast DeepSeek-V4.1 MoE of one step: the sqrt-softplus noaux_tc router in fp32, experts through the MoE kernel.

Router (runtime/models/dsv41/reference/moe.py `route`): scores = sqrt(softplus(x @ gate^T)), the top-k of scores + bias by
a stable sort (ties to the lower expert id), weights = the picked scores normalised, times routed_scaling. The
gate weight stays bf16 as stored: x is split into three bf16 parts (x = hi + mid + lo to within fp32 rounding)
that go through one bf16 x bf16 -> fp32 product, and the three row blocks are summed in order. The experts
(clamped SwiGLU, shared expert last) run on the step's first `live` rows only: padding rows pick no experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from tfc.runtime.models.dsv41.fast.graph_keys import CHUNK_ROWS
from tfc.runtime.models.dsv41.fast.stages import fused


@fused(kernel="tfc.kernels.dsv41.router_pick:split3")
def split3(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[3R, D]: x as three parts in `dtype` (hi, mid, lo) whose sum is x to within fp32 rounding."""
    hi = x.to(dtype)
    mid = (x - hi.float()).to(dtype)
    lo = (x - hi.float() - mid.float()).to(dtype)
    return torch.cat((hi, mid, lo))


@fused(kernel="tfc.kernels.dsv41.router_pick:pick")
def pick(prod: torch.Tensor, split: bool, bias: torch.Tensor, top_k: int, scaling: float, normalise: bool):
    """(weights [R, k], expert ids [R, k]) from the logits [R, E], or the three parts' products [3R, E] (split)."""
    rows = prod.shape[0] // 3
    logits = (prod[:rows] + prod[rows : 2 * rows]) + prod[2 * rows :] if split else prod
    scores = F.softplus(logits).sqrt()
    ids = torch.sort(scores + bias, dim=-1, descending=True, stable=True).indices[..., :top_k]
    picked = scores.gather(-1, ids)
    if normalise and top_k > 1:
        picked = picked / (picked.sum(-1, keepdim=True) + 1e-20)
    return picked * scaling, ids


def route(ops, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, top_k: int, scaling: float,
          normalise: bool) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(weights [R, k], expert ids [R, k]) of the rows x [R, D] (an fp32 router weight: one fp32 product), 16
    rows at a time: the product's bits depend on its rows (cuBLAS picks its algorithm by shape), not on a row's place."""
    if x.shape[0] > CHUNK_ROWS:
        parts = [route(ops, x[lo : lo + CHUNK_ROWS], weight, bias, top_k, scaling, normalise)
                 for lo in range(0, x.shape[0], CHUNK_ROWS)]  # fmt: skip
        return torch.cat([w for w, _ in parts]), torch.cat([i for _, i in parts])
    if weight.dtype == torch.float32:
        return pick(x @ weight.T, False, bias, top_k, scaling, normalise)
    return pick(ops.mm_bf16(split3(x, weight.dtype), weight), True, bias, top_k, scaling, normalise)


def moe(f, layer: int, x: torch.Tensor, live: int) -> torch.Tensor:
    """The MoE block of backbone layer `layer` on the step's rows x [R, D]; rows from `live` on come back as zeros."""
    return block_moe(f, f"layers.{layer}", x, live, f.cfg.num_experts_per_tok, layer)


def block_moe(
    f, block: str, x: torch.Tensor, live: int, top_k: int, layer: int | None = None
) -> torch.Tensor:
    """The MoE of any block (`layers.3`, `mtp.0`) with its own top-k; `layer` names its routes in a trace."""
    cfg, w = f.cfg, f.weights
    p = f"{block}.ffn"
    weights, ids = route(f.ops, x, w.native(f"{p}.gate.weight"), w.native(f"{p}.gate.bias"),
                         top_k, cfg.routed_scaling_factor, cfg.norm_topk_prob)  # fmt: skip
    if f.routes is not None and layer is not None:
        f.routes.append((layer, ids[:live].clone()))
    moe = f.ops.moe if f.tp is None else f.tp.moe
    y = moe(x[:live], ids[:live], weights[:live], w.experts(block), cfg.swiglu_limit)
    if live < x.shape[0]:
        y = torch.cat((y, torch.zeros(x.shape[0] - live, y.shape[1], dtype=y.dtype, device=y.device)))
    return y
