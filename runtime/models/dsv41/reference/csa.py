"""The CSA2 compressed branch of DeepSeek-V4.1: KV compressor, lightning indexer, candidate blocks.

Reference: huggingface/transformers deepseek_v41 modeling at 0a2080b4 (`DeepseekV41Compressor`,
`DeepseekV41CSACache.store_compression_weights`, `DeepseekV41Indexer`, `select_candidate_blocks`).

Compressor (KV sources only), x = the layer's attn_norm output, r = compress_ratio:
    r = 1: latent_t = norm(x_t @ wkv)                              one entry per token
    r > 1: latent_g = norm(sum_j softmax_j(x_j @ wgate) * (x_j @ wkv))   over the r tokens of group g
    group g covers positions g*r .. g*r+r-1 and is rotated at position g*r (compress rope);
    entry_g = FP4(rope(latent_g))  (e2m1, e4m3 scale per 16)     -> the shared compressed KV
    ikey_g  = FP4(rope(k_norm(latent_g @ indexer.wk)))  (UE8M0 scale per 32; index sources that own a compressor)
Indexer (index sources), q_res = q_norm(x @ wq_a):
    q = FP4(rope(q_res @ indexer.wq_b))  [heads, index_head_dim], w = (x @ weights_proj^T) / sqrt(heads)
    score_g = sum_h w_h * relu(q_h . ikey_g) / sqrt(index_head_dim)   for visible g < (pos + 1) // r, else -inf
    the candidate source keeps the top `candidate_topk_blocks` blocks of `candidate_block_size` entries (the
    block of the newest visible entry always in); later index sources score only inside them;
    the attended set is the top `index_topk` visible entries (bias 0, the rest -inf), reused by later layers.
Ties are broken towards the lower entry / block index (a stable sort), so every batch shape picks alike.
"""

from __future__ import annotations

import torch
from tfc.runtime.models.dsv41.reference.numerics import wide
from tfc.runtime.models.dsv41.reference.quant import fake_quant_fp4
from tfc.runtime.models.dsv41.reference.rope import apply_rope
from tfc.runtime.models.dsv41.reference.state import CompressorState

NEG_INF = float("-inf")


@wide
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps) over the last axis."""
    return weight * (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps))


def compress(
    state: CompressorState,
    kv: torch.Tensor,
    gate: torch.Tensor | None,
    norm_weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor | None, int]:
    """Feed one chunk's projected rows [n, head_dim]; returns (normalised latents of the groups it
    completes [G, head_dim] or None, the position of the first such group's first token).

    The rows take the state's dtype whether or not they wait for their group (so where a chunk ends
    cannot change a latent); the pooling runs in the rows' own dtype."""
    ratio, work = state.ratio, kv.dtype
    first = state.groups * ratio
    kv, gate = state.join(kv, gate)
    usable = kv.shape[0] // ratio * ratio
    state.pending_kv = kv[usable:]
    if gate is not None:
        state.pending_gate = gate[usable:]
        gate = gate.to(work)
    if usable == 0:
        return None, first
    kv = kv.to(work)
    if ratio == 1:
        latent = kv
    else:
        groups = kv[:usable].unflatten(0, (-1, ratio))
        weights = torch.softmax(gate[:usable].unflatten(0, (-1, ratio)), dim=1)
        latent = (groups * weights).sum(1)
    return rms_norm(latent, norm_weight, eps), first


@wide
def index_scores(
    q_res: torch.Tensor,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor,
    wq_b: torch.Tensor,
    weights_proj: torch.Tensor,
    n_heads: int,
) -> torch.Tensor:
    """Indexer scores [n, G] of n queries against G indexer keys (no visibility mask yet)."""
    head_dim = keys.shape[-1]
    q = (q_res @ wq_b).unflatten(-1, (n_heads, head_dim))
    q = fake_quant_fp4(apply_rope(q, cos.unsqueeze(-2), sin.unsqueeze(-2)), 32)
    scores = torch.relu(torch.einsum("nhd,gd->nhg", q, keys)) * head_dim**-0.5
    w = (x @ weights_proj.T) * n_heads**-0.5
    return (scores * w.unsqueeze(-1)).sum(1)


def visible(scores: torch.Tensor, positions: torch.Tensor, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores with entries not yet complete at each query set to -inf, visible counts [n, 1])."""
    lens = (positions.unsqueeze(-1) + 1) // ratio
    entry = torch.arange(scores.shape[-1], device=scores.device)
    return scores.masked_fill(entry >= lens, NEG_INF), lens


def _top_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the k best finite scores per row; ties go to the lower index."""
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]
    keep = scores.gather(-1, order) > NEG_INF
    return torch.zeros_like(scores, dtype=torch.bool).scatter(-1, order, keep)


def candidate_blocks(scores: torch.Tensor, lens: torch.Tensor, top_blocks: int, block: int) -> torch.Tensor:
    """Bool [n, G]: entries inside each query's best `top_blocks` blocks (newest block pinned in)."""
    width = scores.shape[-1]
    padded = torch.nn.functional.pad(scores, (0, -width % block), value=NEG_INF)
    block_scores = padded.unflatten(-1, (-1, block)).amax(-1)
    newest = (lens - 1) // block
    pinned = torch.arange(block_scores.shape[-1], device=scores.device) == newest
    block_scores = block_scores.masked_fill(pinned, float("inf"))
    keep = _top_mask(block_scores, min(top_blocks, block_scores.shape[-1]))
    return keep.repeat_interleave(block, dim=-1)[..., :width]


def topk_bias(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Attention bias [n, G]: 0 on the `k` best visible entries of each query, -inf elsewhere."""
    keep = _top_mask(scores, min(k, scores.shape[-1]))
    return torch.zeros_like(scores).masked_fill(~keep, NEG_INF)
