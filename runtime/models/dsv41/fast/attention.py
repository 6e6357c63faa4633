"""Fast DeepSeek-V4.1 attention of one step: q-LoRA, the shared K=V latent, window ring + selected entries, sinks.

The maths of runtime/models/dsv41/reference/attention.py in fp32 over fixed shapes: each row attends to its window's
`sliding_window` keys read back from the FP8 ring (its own key included, written first) and, on compressed
layers, to the `index_topk` entries its index source selected, read back from the FP4 pool; keys that are not
there (before position 0, fewer entries than index_topk) are masked, and their values zeroed so a masked
row can never carry a NaN in. Every product has the same shape whatever the step's live rows or context (and,
on a tensor-parallel rank, whatever its heads: fast/tp.py).
"""

from __future__ import annotations

import torch
from tfc.packs.deepseek_v41_contract import LayerMode
from tfc.runtime.models.dsv41.fast.compressed import compress, index
from tfc.runtime.models.dsv41.fast.fp32 import plain_rms_norm, rms_norm
from tfc.runtime.models.dsv41.fast.kv.rows import pack_fp8, unpack_fp4, unpack_fp8
from tfc.runtime.models.dsv41.fast.overlap import SideBranch
from tfc.runtime.models.dsv41.fast.rope import apply_rope
from tfc.runtime.models.dsv41.fast.stages import fused
from tfc.runtime.models.dsv41.fast.step_context import StepContext


def attend(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Sink attention of q [R, H, d] over each row's keys [R, K, d] (valid [R, K]); K = V."""
    values = torch.where(valid.unsqueeze(-1), keys, torch.zeros_like(keys))
    logits = torch.bmm(q, values.transpose(1, 2)) * q.shape[-1] ** -0.5
    logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
    sink = sinks.view(1, -1, 1).expand(q.shape[0], -1, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
    return torch.bmm(probs, values)


@fused(kernel="tfc.kernels.dsv41.mhc_stages:rope_heads")
def rope_heads(y: torch.Tensor, heads: int, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rows [R, heads * d] as heads [R, heads, d], their rope slice rotated."""
    return apply_rope(y.view(y.shape[0], heads, -1), cos.unsqueeze(1), sin.unsqueeze(1))


@fused(kernel="tfc.kernels.dsv41.kv_pack:window_rows")
def window_rows(
    y: torch.Tensor, weight: torch.Tensor, eps: float, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """The FP8 window rows of the K=V latents: pack(rope(kv_norm(y)))."""
    return pack_fp8(apply_rope(plain_rms_norm(y, weight, eps), cos, sin))


@fused(kernel="tfc.kernels.dsv41.attend_rows:attend_rows")
def attend_rows(
    q, ring, read, valid, sinks, cos, sin, entries=None, at=None, ok=None, grid=None
) -> torch.Tensor:
    """Each row's window keys (and selected entries) read back and attended; the query's rotation taken off."""
    hd = q.shape[-1]
    keys = unpack_fp8(ring[read], hd)
    if entries is not None:
        keys = torch.cat((keys, unpack_fp4(entries[at], hd, 16, True, grid)), dim=1)
        valid = torch.cat((valid, ok), dim=1)
    out = attend(q, keys, valid, sinks)
    return apply_rope(out, cos.unsqueeze(1), sin.unsqueeze(1), inverse=True)


def wo_a(f, p: str, out: torch.Tensor, local: tuple[int, ...]) -> torch.Tensor:
    """The grouped output projection of the wo_a groups `local` (of the heads' outputs out [R, H * d]), joined,
    in one grouped launch (`f.live` as in f.lin); groups that are not a run of heads are gathered first."""
    lins = [f.weights.linear(f"{p}.wo_a.slice.{g}") for g in local]
    k = lins[0].k
    if local == tuple(range(local[0], local[0] + len(local))):
        x = out[:, local[0] * k : (local[-1] + 1) * k]
    else:
        x = torch.cat([out[:, g * k : (g + 1) * k] for g in local], dim=-1)
    return f.ops.linear_groups(x, lins, f.live)


def attention(f, layer: int, mode: LayerMode, x: torch.Tensor, sc: StepContext) -> torch.Tensor:
    """One attention layer on the step's rows x [R, D]; writes its window rows (and, on full layers, entries)."""
    cfg, w = f.cfg, f.weights
    p = f"layers.{layer}.attn"
    rows, heads, eps = x.shape[0], cfg.num_attention_heads, cfg.rms_norm_eps
    cos, sin = sc.rope["compress" if mode.compress_ratio else "main"]
    ring = f.kv.window[layer].view(-1, f.kv.window.shape[-1])
    with SideBranch(f, x) as kv_rows:  # only writes the KV memory: beside the queries where overlap is on
        ring[sc.ring_write] = window_rows(
            f.lin(x, f"{p}.wkv"), w.native(f"{p}.kv_norm.weight"), eps, cos, sin
        )
        if mode.mode == "full":
            compress(f, layer, mode, x, sc)
    q_res = rms_norm(f.lin(x, f"{p}.wq_a"), w.native(f"{p}.q_norm.weight"), eps)
    q_all = f.lin(q_res, f"{p}.wq_b") if f.tp is None else f.tp.queries(q_res, w.linear(f"{p}.wq_b"))
    q = rope_heads(q_all, heads, cos, sin)
    kv_rows.join()
    if mode.is_index_source:
        index(f, layer, mode, x, q_res, sc)
    compressed = {}
    if mode.compress_ratio:
        picked, ok = sc.selection[mode.index_source]
        at = sc.ratios[mode.compress_ratio].addr(picked)
        compressed = {"entries": f.kv.entries[mode.kv_source], "at": at, "ok": ok, "grid": f.grid}
    sinks = w.native(f"{p}.attn_sink") if f.tp is None else f.tp.every_head(w.native(f"{p}.attn_sink"))
    out = attend_rows(q, ring, sc.window_read, sc.window_valid, sinks, cos, sin, **compressed)
    mixed = wo_a(f, p, out.reshape(rows, -1), f.shard.local_groups(cfg.o_groups))
    if f.tp is None:
        return f.lin(mixed, f"{p}.wo_b")
    return f.tp.rows(mixed, w.linear(f"{p}.wo_b"), cfg.o_groups * cfg.o_lora_rank)
