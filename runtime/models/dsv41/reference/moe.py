"""DeepSeek-V4.1 MoE: sqrt-softplus router, noaux_tc bias-corrected top-k, clamped SwiGLU experts, shared expert.

Reference: huggingface/transformers deepseek_v41 modeling at 0a2080b4 (`DeepseekV41TopKRouter`,
`DeepseekV41Expert`, `DeepseekV41SparseMoeBlock`):

    s = sqrt(softplus(x @ gate.weight^T))                  scores (gate_temp 1)
    idx = topk(s + gate.bias, k)                           the bias steers selection only
    w = s[idx] / (sum s[idx] + 1e-20) * routed_scaling     normalised when norm_topk_prob and k > 1
    expert(x) = w2((w *) silu(min(x@w1, L)) * clamp(x@w3, -L, L))     L = swiglu_limit (off when 0)
    y = sum_e expert_e(x) + shared(x)

Weights are dense [in, out] (w1, w3: [D, I]; w2: [I, D]); router weight [E, D] and bias [E] as stored.
At TP=N a rank holds every expert's columns of I (w1, w3) and the same rows of w2: the experts' and the
shared expert's 128-row block products are summed as fixed-point integers and `reduce` adds the ranks'.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from tfc.runtime.models.dsv41.reference.numerics import (
    column_linear,
    fixed_sum,
    from_fixed,
    row_partials,
    wide,
)


@wide
def route(
    x: torch.Tensor,
    gate_weight: torch.Tensor,
    gate_bias: torch.Tensor,
    top_k: int,
    scaling: float,
    normalise: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [T, k], expert ids [T, k]) for tokens x [T, D]."""
    scores = F.softplus(x @ gate_weight.T).sqrt()
    biased = scores + gate_bias
    # Stable descending sort: equal biased scores pick the lower expert id, on every rank and batch shape.
    ids = torch.sort(biased, dim=-1, descending=True, stable=True).indices[..., :top_k]
    weights = scores.gather(-1, ids)
    if normalise and top_k > 1:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    return weights * scaling, ids


def swiglu(
    x: torch.Tensor,
    w1: torch.Tensor,
    w3: torch.Tensor,
    w2: torch.Tensor,
    limit: float,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """One clamped SwiGLU expert as a fixed-point sum int64 [2, T, D]; `weight` [T, 1] scales the activation."""
    gate = column_linear(x, w1)
    up = column_linear(x, w3)
    if limit > 0:
        up = up.clamp(-limit, limit)
        gate = gate.clamp(max=limit)
    act = F.silu(gate) * up
    if weight is not None:
        act = act * weight
    return fixed_sum(row_partials(act, w2))


@wide
def moe(
    x: torch.Tensor,
    get: Callable[[str], torch.Tensor],
    prefix: str,
    n_experts: int,
    top_k: int,
    scaling: float,
    limit: float,
    normalise: bool = True,
    shared: bool = True,
    reduce: Callable[[torch.Tensor], torch.Tensor] = from_fixed,
) -> torch.Tensor:
    """The MoE block on tokens x [T, D]; `get(name)` returns dense weights by their pack name."""
    weights, ids = route(
        x, get(f"{prefix}.gate.weight"), get(f"{prefix}.gate.bias"), top_k, scaling, normalise
    )
    if weights.shape[-1] and int(ids.max()) >= n_experts:
        raise ValueError(f"{prefix}: router picked expert {int(ids.max())} of {n_experts}")
    acc = torch.zeros(2, *x.shape, dtype=torch.int64, device=x.device)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        p = f"{prefix}.experts.{e}"
        y = swiglu(x[tok], get(f"{p}.w1"), get(f"{p}.w3"), get(f"{p}.w2"), limit, weights[tok, slot, None])
        acc.index_add_(1, tok, y)
    if shared:
        p = f"{prefix}.shared_experts"
        acc += swiglu(x, get(f"{p}.w1"), get(f"{p}.w3"), get(f"{p}.w2"), limit)
    return reduce(acc)
