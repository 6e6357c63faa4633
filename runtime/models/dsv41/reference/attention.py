"""DeepSeek-V4.1 attention: q-LoRA, one shared K=V latent head, sliding window + CSA2 compressed entries, sinks.

Reference: huggingface/transformers deepseek_v41 modeling at 0a2080b4 (`DeepseekV41Attention.forward`,
`eager_attention_forward`, `DeepseekV41GroupedLinear`). For tokens x (attn_norm output) at positions p:

    q_res = q_norm(x @ wq_a);  q = rope(q_res @ wq_b)          [heads, head_dim]
    kv    = FP8(rope(kv_norm(x @ wkv)))                        [head_dim], K = V, UE8M0 scale per 32
    keys  = this layer's kv at positions (p - window, p]  (+ compressed entries, bias 0/-inf from the indexer)
    o     = softmax([q.keys / sqrt(head_dim) + mask, sink_h]) without the sink column, @ keys
    o     = rope^-1(o)  (removes the query rotation carried by V's rope slice)
    y     = concat_g(o[heads of group g] @ wo_a.slice.g) @ wo_b
rope is the `compress` table on layers with compress_ratio > 0 and `main` on the others. The layer computes
in float64 (runtime/models/dsv41/reference/numerics.py); its result and the state it keeps take x's dtype. Heads are
attended one wo_a group at a time (a TP rank holds whole groups); wo_b's 128-row block products are summed
as fixed-point integers, added across ranks by the shard.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tfc.runtime.models.dsv41.config import Dsv41Config, LayerMode
from tfc.runtime.models.dsv41.reference.csa import (
    NEG_INF,
    candidate_blocks,
    compress,
    index_scores,
    rms_norm,
    topk_bias,
    visible,
)
from tfc.runtime.models.dsv41.reference.numerics import (
    WIDE,
    column_linear,
    fixed_sum,
    linear,
    row_partials,
    wide,
)
from tfc.runtime.models.dsv41.reference.quant import fake_quant_fp4, fake_quant_fp8
from tfc.runtime.models.dsv41.reference.rope import Rope, apply_rope
from tfc.runtime.models.dsv41.reference.state import SequenceState, WindowRing, new_compressor
from tfc.runtime.models.dsv41.shard import Shard

Getter = Callable[[str], torch.Tensor]


@dataclass
class Segment:
    """One sequence's rows [start, end) of a flat token batch, its state and this forward's shared state."""

    start: int
    end: int
    state: SequenceState
    shared: dict = field(default_factory=dict)  # compress_kv, index_k, topk_bias, candidates (latest source)


@wide
def attend(
    q: torch.Tensor,
    keys: torch.Tensor,
    key_pos: torch.Tensor,
    q_pos: torch.Tensor,
    window: int,
    sinks: torch.Tensor,
    compressed: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Sink attention of q [n, H, d] over window keys [K, d] (+ compressed [G, d] with bias [n, G])."""
    scale = q.shape[-1] ** -0.5
    logits = torch.einsum("nhd,kd->nhk", q, keys) * scale
    seen = (key_pos <= q_pos.unsqueeze(-1)) & (key_pos > q_pos.unsqueeze(-1) - window)
    logits = logits.masked_fill(~seen.unsqueeze(1), NEG_INF)
    values = keys
    if compressed is not None and bias is not None and compressed.shape[0]:
        extra = torch.einsum("nhd,gd->nhg", q, compressed) * scale + bias.unsqueeze(1)
        logits = torch.cat((logits, extra), dim=-1)
        values = torch.cat((keys, compressed))
    sink = sinks.view(1, -1, 1).expand(q.shape[0], -1, 1)
    logits = torch.cat((logits, sink), dim=-1)
    probs = torch.softmax(logits - logits.amax(-1, keepdim=True), dim=-1)[..., :-1]
    return torch.einsum("nhk,kd->nhd", probs, values)


def attention(
    x: torch.Tensor,
    positions: torch.Tensor,
    segments: list[Segment],
    mode: LayerMode,
    cfg: Dsv41Config,
    get: Getter,
    rope: Rope,
    shard: Shard | None = None,
) -> torch.Tensor:
    """One attention layer on flat tokens x [T, D] at positions [T]; updates each segment's state.

    Computes in float64; the result, the window ring and the compressor state take x's dtype."""
    p = f"layers.{mode.layer}.attn"
    shard = shard or Shard()
    eps, hd = cfg.rms_norm_eps, cfg.head_dim
    groups, per = shard.local_groups(cfg.o_groups), cfg.num_attention_heads // cfg.o_groups
    act, x = x.dtype, x.to(WIDE)
    cos, sin = (
        t.to(WIDE) for t in rope.cos_sin(positions, "compress" if mode.compress_ratio else "main", act)
    )
    q_res = rms_norm(linear(x, get(f"{p}.wq_a")), get(f"{p}.q_norm.weight"), eps)
    q = apply_rope(
        column_linear(q_res, get(f"{p}.wq_b")).unflatten(-1, (-1, hd)), cos.unsqueeze(-2), sin.unsqueeze(-2)
    )
    kv = fake_quant_fp8(
        apply_rope(rms_norm(linear(x, get(f"{p}.wkv")), get(f"{p}.kv_norm.weight"), eps), cos, sin), 32
    )
    ckv = cgate = None
    if mode.mode == "full":
        ckv = linear(x, get(f"{p}.compressor.wkv"))
        if mode.compress_ratio > 1:
            cgate = linear(x, get(f"{p}.compressor.wgate"))
    sinks = get(f"{p}.attn_sink")
    out = torch.empty_like(q)
    for seg in segments:
        rows = slice(seg.start, seg.end)
        ring = seg.state.windows.get(mode.layer)
        if ring is None:
            ring = seg.state.windows[mode.layer] = WindowRing(cfg.sliding_window, hd, act, x.device)
        start = seg.state.position
        prior, prior_pos = ring.before(start)
        keys = torch.cat((prior.to(WIDE), kv[rows]))
        key_pos = torch.cat((prior_pos, positions[rows]))
        ring.write(start, kv[rows])
        compressed = bias = None
        if mode.compress_ratio:
            ctx = _Rows(x[rows], q_res[rows], positions[rows], cos[rows], sin[rows])
            if mode.mode == "full":
                _compress(seg, ckv[rows], None if cgate is None else cgate[rows], mode, cfg, get, rope, act)
            if mode.is_index_source:
                _index(seg, ctx, mode, cfg, get)
            compressed, bias = seg.shared.get("compress_kv"), seg.shared.get("topk_bias")
        for j in range(len(groups)):  # one group at a time: the same call at every TP world
            h = slice(j * per, (j + 1) * per)
            out[rows, h] = attend(
                q[rows, h].contiguous(), keys, key_pos, positions[rows], cfg.sliding_window, sinks[h],
                compressed, bias,
            )  # fmt: skip
    out = apply_rope(out, cos.unsqueeze(-2), sin.unsqueeze(-2), inverse=True)
    mixed = [
        linear(out[:, j * per : (j + 1) * per].flatten(1), get(f"{p}.wo_a.slice.{g}"))
        for j, g in enumerate(groups)
    ]
    return shard.reduce(fixed_sum(row_partials(torch.cat(mixed, dim=-1), get(f"{p}.wo_b")))).to(act)


@dataclass(frozen=True)
class _Rows:
    """One sequence's slice of the per-token inputs the compressed branch reads."""

    x: torch.Tensor
    q_res: torch.Tensor
    positions: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor


def _compress(
    seg: Segment,
    ckv: torch.Tensor,
    cgate: torch.Tensor | None,
    mode: LayerMode,
    cfg: Dsv41Config,
    get: Getter,
    rope: Rope,
    act: torch.dtype,
) -> None:
    """A KV source: close the groups this chunk completes, publish entries and indexer keys (state in `act`)."""
    p = f"layers.{mode.layer}.attn"
    state = seg.state.compressors.get(mode.layer)
    if state is None:
        index_dim = cfg.index_head_dim if mode.is_index_source else None
        state = new_compressor(mode.compress_ratio, cfg.head_dim, index_dim, act, ckv.device)
        seg.state.compressors[mode.layer] = state
    latent, first = compress(state, ckv, cgate, get(f"{p}.compressor.norm.weight"), cfg.rms_norm_eps)
    if latent is not None:
        group_pos = first + mode.compress_ratio * torch.arange(latent.shape[0], device=latent.device)
        gcos, gsin = (t.to(latent.dtype) for t in rope.cos_sin(group_pos, "compress", act))
        if state.index_keys is not None:
            # Index keys come from the pre-rope latent, rotated and FP4-quantised on their own.
            ik = rms_norm(
                linear(latent, get(f"{p}.indexer.wk")), get(f"{p}.indexer.k_norm.weight"), cfg.rms_norm_eps
            )
            state.index_keys.append(fake_quant_fp4(apply_rope(ik, gcos, gsin), 32))
        state.entries.append(fake_quant_fp4(apply_rope(latent, gcos, gsin), 16, e4m3_scale=True))
    seg.shared["compress_kv"] = state.entries.view()
    if state.index_keys is not None:
        seg.shared["index_k"] = state.index_keys.view()


def _index(seg: Segment, ctx: _Rows, mode: LayerMode, cfg: Dsv41Config, get: Getter) -> None:
    """An index source: score the source's indexer keys, publish the top-k bias (and candidates)."""
    p = f"layers.{mode.layer}.attn.indexer"
    keys = seg.shared.get("index_k")
    if keys is None or keys.shape[0] == 0:
        seg.shared["topk_bias"] = None
        if mode.is_candidate_source:
            seg.shared["candidates"] = None
        return
    scores = index_scores(
        ctx.q_res,
        ctx.x,
        ctx.cos,
        ctx.sin,
        keys,
        get(f"{p}.wq_b"),
        get(f"{p}.weights_proj.weight"),
        cfg.index_n_heads,
    )
    scores, lens = visible(scores, ctx.positions, mode.compress_ratio)
    if mode.is_candidate_source:
        seg.shared["candidates"] = candidate_blocks(
            scores, lens, cfg.candidate_topk_blocks, cfg.candidate_block_size
        )
    elif mode.uses_candidates and seg.shared.get("candidates") is not None:
        scores = scores.masked_fill(~seg.shared["candidates"], NEG_INF)
    seg.shared["topk_bias"] = topk_bias(scores, cfg.index_topk)
