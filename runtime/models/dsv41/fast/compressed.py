"""The CSA2 compressed branch of one step: KV compressor, lightning indexer, candidate blocks (fixed shapes).

The maths of runtime/models/dsv41/reference/csa.py and attention.py `_compress` / `_index` in fp32. A ratio-r source
keeps every row's projected kv / gate rows in a per-slot ring (row = position % ring) and a row that closes a
group pools the group's r rows from it, so a group's tokens may arrive in any steps. The indexer scores a row's
query against the index keys of the step's whole context bucket through the page table, the entries the row
cannot see yet at -inf. Its dot products are exact: query and keys are e2m1 values times one power of two per
32 channels, so each 32-channel partial sum is exact in fp32 whatever the summation order, and the four
partials and the heads are summed in a fixed order; the top-k is a stable sort (ties to the lower entry).
A row's selection thus never depends on the bucket, the other rows or the kernels cuBLAS picks.
"""

from __future__ import annotations

import torch
from tfc.packs.deepseek_v41_contract import LayerMode
from tfc.runtime.models.dsv41.fast.fp32 import fixed_sum, plain_rms_norm, rms_norm
from tfc.runtime.models.dsv41.fast.kv.rows import fake_fp4, pack_fp4, unpack_fp4
from tfc.runtime.models.dsv41.fast.rope import apply_rope
from tfc.runtime.models.dsv41.fast.row_chunks import by_chunks
from tfc.runtime.models.dsv41.fast.stages import fused, stage_kernel
from tfc.runtime.models.dsv41.fast.step_context import StepContext

NEG_INF = float("-inf")
SCORE_CHUNK = 4096  # entries scored at a time (bounds the fp32 keys and partial products a step holds)


@fused(kernel="tfc.kernels.dsv41.kv_pack:pooled")
def pooled(
    pending: torch.Tensor, slot: torch.Tensor, at: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """The normalised latents of the groups at ring rows at [R, r]: softmax(gate)-weighted sums of their kv rows."""
    return plain_rms_norm(
        (pending[0][slot, at] * torch.softmax(pending[1][slot, at], dim=1)).sum(1), weight, eps
    )


@fused(kernel="tfc.kernels.dsv41.kv_pack:entry_rows")
def entry_rows(latent: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, grid) -> torch.Tensor:
    """The FP4 entry rows of normalised latents: pack(rope(latent)) with e4m3 scales per 16."""
    return pack_fp4(apply_rope(latent, cos, sin), 16, True, grid)


@fused(kernel="tfc.kernels.dsv41.kv_pack:key_rows")
def key_rows(
    y: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor, grid
) -> torch.Tensor:
    """The FP4 indexer key rows: pack(rope(k_norm(y))) with UE8M0 scales per 32."""
    return pack_fp4(apply_rope(plain_rms_norm(y, weight, eps), cos, sin), 32, False, grid)


def compress(f, layer: int, mode: LayerMode, x: torch.Tensor, sc: StepContext) -> None:
    """A KV source: pool the groups the step's rows close, write their entries and indexer keys."""
    cfg, w = f.cfg, f.weights
    p, eps = f"layers.{layer}.attn", cfg.rms_norm_eps
    r, rv = mode.compress_ratio, sc.ratios[mode.compress_ratio]
    norm = w.native(f"{p}.compressor.norm.weight")
    latent = f.lin(x, f"{p}.compressor.wkv")
    if r > 1:
        pending = f.kv.pending[layer]
        ring = pending.shape[2]
        pending[0, sc.slots, sc.positions % ring] = latent
        pending[1, sc.slots, sc.positions % ring] = f.lin(x, f"{p}.compressor.wgate")
        at = (rv.group_start.unsqueeze(-1) + torch.arange(r, device=x.device)) % ring
        latent = pooled(pending, sc.slots.unsqueeze(-1), at, norm, eps)
    else:
        latent = rms_norm(latent, norm, eps)
    cos, sin = f.rope.rows("compress", rv.group_start.clamp_min(0))
    f.kv.entries[layer][rv.write] = entry_rows(latent, cos, sin, f.grid)
    if layer in f.kv.keys:
        ik = f.lin(latent, f"{p}.indexer.wk")
        f.kv.keys[layer][rv.write] = key_rows(
            ik, w.native(f"{p}.indexer.k_norm.weight"), eps, cos, sin, f.grid
        )


def index_scores(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Scores [R, C] = sum_h weights_h * relu(q_h . key) / sqrt(d) of FP4 queries [R, H, d] and keys [R, C, d]."""
    rows, heads, d = q.shape
    blocks = d // 32
    qb = q.view(rows, heads, blocks, 32).transpose(1, 2)
    kb = keys.view(rows, keys.shape[1], blocks, 32).permute(0, 2, 3, 1)
    dots = fixed_sum(torch.matmul(qb, kb), 1)
    return fixed_sum(torch.relu(dots) * d**-0.5 * weights.unsqueeze(-1), 1)


def candidate_mask(scores: torch.Tensor, visible: torch.Tensor, top_blocks: int, block: int) -> torch.Tensor:
    """Bool [R, C]: entries inside each row's best `top_blocks` blocks of `block` entries (its newest block pinned)."""
    rows, width = scores.shape
    padded = torch.nn.functional.pad(scores, (0, -width % block), value=NEG_INF)
    nb = padded.shape[-1] // block
    best = padded.view(rows, nb, block).amax(-1)
    newest = torch.div(visible - 1, block, rounding_mode="floor").unsqueeze(-1)
    best = best.masked_fill(torch.arange(nb, device=scores.device) == newest, float("inf"))
    order = torch.sort(best, dim=-1, descending=True, stable=True).indices[:, : min(top_blocks, nb)]
    keep = torch.zeros_like(best, dtype=torch.bool).scatter(-1, order, best.gather(-1, order) > NEG_INF)
    return keep.unsqueeze(-1).expand(rows, nb, block).reshape(rows, nb * block)[:, :width]


@fused(kernel="tfc.kernels.dsv41.kv_pack:index_query")
def index_query(y: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor, grid) -> torch.Tensor:
    """The indexer's FP4 queries [R, heads, d]: fake-quantised rope(y)."""
    q = apply_rope(y.view(y.shape[0], heads, -1), cos.unsqueeze(1), sin.unsqueeze(1))
    return fake_fp4(q, 32, grid)


def chunk_scores(raw: torch.Tensor, q: torch.Tensor, weights: torch.Tensor, grid) -> torch.Tensor:
    """Scores [R, c] of one chunk of index key rows [R, c, key bytes]."""
    return index_scores(q, unpack_fp4(raw, q.shape[-1], 32, False, grid), weights)


@fused(kernel="tfc.kernels.dsv41.router_pick:select")
def select(scores: torch.Tensor, visible: torch.Tensor, k: int, candidates: torch.Tensor | None, top_blocks: int,
           block: int, make_candidates: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:  # fmt: skip
    """(top-k entries [R, k], which are real, the candidate mask when this layer makes one) of raw scores."""
    entry = torch.arange(scores.shape[-1], device=scores.device)
    scores = scores.masked_fill(entry >= visible.unsqueeze(-1), NEG_INF)
    made = None
    if make_candidates:
        made = candidate_mask(scores, visible, top_blocks, block)
    elif candidates is not None:
        scores = scores.masked_fill(~candidates, NEG_INF)
    if (
        scores.shape[-1] < k
    ):  # always k picks (the rest not real), so attention's width never follows the bucket
        scores = torch.nn.functional.pad(scores, (0, k - scores.shape[-1]), value=NEG_INF)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :k]
    ok = scores.gather(-1, order) > NEG_INF
    return torch.where(ok, order, torch.zeros_like(order)), ok, made


def entry_scores(pool: torch.Tensor, rv, q: torch.Tensor, weights: torch.Tensor, grid) -> torch.Tensor:
    """Scores [R, entries] of the index keys each row's pages hold: read where they lie by the stage kernel
    (kernels/index_scores.paged_scores) where it runs, else gathered and scored in chunks; the same bits."""
    paged = stage_kernel("tfc.kernels.dsv41.index_scores:paged_scores", q)
    if paged is not None:
        return paged(pool, rv.pages, rv.per_page, q, weights)
    rows = q.shape[0]
    raw = pool.view(-1, rv.per_page, pool.shape[-1])[rv.pages].reshape(rows, rv.entries, pool.shape[-1])
    parts = [
        chunk_scores(raw[:, lo : lo + SCORE_CHUNK], q, weights, grid)
        for lo in range(0, rv.entries, SCORE_CHUNK)
    ]
    return torch.cat(parts, dim=-1) if len(parts) > 1 else parts[0]


def index(f, layer: int, mode: LayerMode, x: torch.Tensor, q_res: torch.Tensor, sc: StepContext) -> None:
    """An index source: each row's top `index_topk` visible entries of its KV source (and candidates)."""
    cfg, w = f.cfg, f.weights
    p = f"layers.{layer}.attn.indexer"
    rv = sc.ratios[mode.compress_ratio]
    heads = cfg.index_n_heads
    cos, sin = sc.rope["compress"]
    q = index_query(f.lin(q_res, f"{p}.wq_b"), heads, cos, sin, f.grid)
    proj = w.native(f"{p}.weights_proj.weight").T
    weights = by_chunks(lambda rows, _, __: rows @ proj, x) * heads**-0.5  # cuBLAS bits depend on the rows
    scores = entry_scores(f.kv.keys[mode.kv_source], rv, q, weights, f.grid)
    candidates = sc.candidates if mode.uses_candidates else None
    order, ok, made = select(scores, rv.visible, cfg.index_topk, candidates,
                             cfg.candidate_topk_blocks, cfg.candidate_block_size, mode.is_candidate_source)  # fmt: skip
    if mode.is_candidate_source:
        sc.candidates = made
    sc.selection[layer] = (order, ok)
