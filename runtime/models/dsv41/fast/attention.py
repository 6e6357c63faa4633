"""Fast DeepSeek-V4.1 attention of one step: q-LoRA, the shared K=V latent, window ring + selected entries, sinks.

The maths of runtime/models/dsv41/attention.py in fp32 over fixed shapes: each row attends to its window's
`sliding_window` keys read back from the FP8 ring (its own key included, written first) and, on compressed
layers, to the `index_topk` entries its index source selected, read back from the FP4 pool; keys that are not
there (before position 0, fewer entries than index_topk) are masked, and their values zeroed so a masked
row can never carry a NaN in. Every product has the same shape whatever the step's live rows or context.
"""

from __future__ import annotations

import torch
from tfc.packs.deepseek_v41_contract import LayerMode
from tfc.runtime.models.dsv41.fast.compressed import compress, index
from tfc.runtime.models.dsv41.fast.fp32 import rms_norm
from tfc.runtime.models.dsv41.fast.kv_rows import pack_fp8, unpack_fp4, unpack_fp8
from tfc.runtime.models.dsv41.fast.rope import apply_rope
from tfc.runtime.models.dsv41.fast.step_context import StepContext


def attend(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Sink attention of q [R, H, d] over each row's keys [R, K, d] (valid [R, K]); K = V."""
    values = torch.where(valid.unsqueeze(-1), keys, torch.zeros_like(keys))
    logits = torch.bmm(q, values.transpose(1, 2)) * q.shape[-1] ** -0.5
    logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
    sink = sinks.view(1, -1, 1).expand(q.shape[0], -1, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
    return torch.bmm(probs, values)


def attention(f, layer: int, mode: LayerMode, x: torch.Tensor, sc: StepContext) -> torch.Tensor:
    """One attention layer on the step's rows x [R, D]; writes its window rows (and, on full layers, entries)."""
    cfg, w = f.cfg, f.weights
    p = f"layers.{layer}.attn"
    rows, heads, hd, eps = x.shape[0], cfg.num_attention_heads, cfg.head_dim, cfg.rms_norm_eps
    cos, sin = sc.rope["compress" if mode.compress_ratio else "main"]
    q_res = rms_norm(f.lin(x, f"{p}.wq_a"), w.native(f"{p}.q_norm.weight"), eps)
    q = apply_rope(f.lin(q_res, f"{p}.wq_b").view(rows, heads, hd), cos.unsqueeze(1), sin.unsqueeze(1))
    kv = apply_rope(rms_norm(f.lin(x, f"{p}.wkv"), w.native(f"{p}.kv_norm.weight"), eps), cos, sin)
    ring = f.kv.window[layer].view(-1, f.kv.window.shape[-1])
    ring[sc.ring_write] = pack_fp8(kv)
    if mode.mode == "full":
        compress(f, layer, mode, x, sc)
    if mode.is_index_source:
        index(f, layer, mode, x, q_res, sc)
    keys, valid = unpack_fp8(ring[sc.window_read], hd), sc.window_valid
    if mode.compress_ratio:
        picked, ok = sc.selection[mode.index_source]
        rows_at = sc.ratios[mode.compress_ratio].addr(picked)
        entries = unpack_fp4(f.kv.entries[mode.kv_source][rows_at], hd, 16, True, f.grid)
        keys, valid = torch.cat((keys, entries), dim=1), torch.cat((valid, ok), dim=1)
    out = attend(q, keys, valid, w.native(f"{p}.attn_sink"))
    out = apply_rope(out, cos.unsqueeze(1), sin.unsqueeze(1), inverse=True)
    per = heads // cfg.o_groups
    groups = [
        f.lin(out[:, g * per : (g + 1) * per].reshape(rows, per * hd), f"{p}.wo_a.slice.{g}")
        for g in range(cfg.o_groups)
    ]
    return f.lin(torch.cat(groups, dim=-1), f"{p}.wo_b")
