"""Random dense DeepSeek-V4.1 weights for a config, named as the forward reads them (tests, GPU checks)."""

from __future__ import annotations

from typing import Any

import torch
from tfc.runtime.models.dsv41.config import Dsv41Config

# A small geometry that exercises every mode: swa (0, 1), full ratio 2 (2), reuse (3), full ratio 1 and
# candidate source (4), reuse (5), reindex with candidates (6), reuse (7); Engram on 1 and 4; every
# quantiser active (head_dim 64, index_head_dim 32); 16 index heads so FP4 scores do not tie.
TINY_TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": 256,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "qk_rope_head_dim": 16,
    "q_lora_rank": 32,
    "o_lora_rank": 16,
    "o_groups": 2,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "num_experts_per_tok": 2,
    "routed_scaling_factor": 1.5,
    "norm_topk_prob": True,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "rope_theta": 10000,
    "compress_rope_theta": 160000,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 4,
        "beta_fast": 32,
        "beta_slow": 1,
        "original_max_position_embeddings": 64,
    },
    "max_position_embeddings": 256,
    "sliding_window": 8,
    "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1, 0],
    "kv_source_layer_ids": [2, 4],
    "index_source_layer_ids": [2, 4, 6],
    "index_n_heads": 16,
    "index_head_dim": 32,
    "index_topk": 4,
    "candidate_source_layer_id": 4,
    "candidate_topk_blocks": 2,
    "candidate_block_size": 2,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "engram_layer_ids": [1, 4],
    "engram_max_ngram_size": 3,
    "engram_n_heads": 2,
    "engram_head_dim": 16,
    "num_nextn_predict_layers": 1,
}


def tiny_config_dict() -> dict[str, Any]:
    """A config.json-shaped dict of the tiny geometry (text keys under text_config)."""
    return {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "text_config": dict(TINY_TEXT_CONFIG)}


def random_weights(
    cfg: Dsv41Config, seed: int = 0, dtype: torch.dtype = torch.float32
) -> dict[str, torch.Tensor]:
    """Dense weights for every tensor the forward reads; linears [in, out] scaled 1/sqrt(in)."""
    g = torch.Generator().manual_seed(seed)
    w: dict[str, torch.Tensor] = {}

    def normal(name: str, *shape: int, std: float = 1.0, mean: float = 0.0) -> None:
        w[name] = (torch.randn(*shape, generator=g, dtype=torch.float64) * std + mean).to(dtype)

    def linear(name: str, k: int, n: int) -> None:
        normal(name, k, n, std=k**-0.5)

    d, hc, qr, hd = cfg.hidden_size, cfg.hc_mult, cfg.q_lora_rank, cfg.head_dim
    normal("embed.weight", cfg.vocab_size, d)
    normal("norm.weight", d, std=0.1, mean=1.0)
    linear("head", d, cfg.vocab_size)
    for layer in range(cfg.num_hidden_layers):
        b, mode = f"layers.{layer}", cfg.layer_mode(layer)
        for site in ("attn", "ffn"):
            normal(f"{b}.{site}_norm.weight", d, std=0.1, mean=1.0)
            normal(f"{b}.hc_{site}_fn", (2 + hc) * hc, hc * d, std=(hc * d) ** -0.5)
            normal(f"{b}.hc_{site}_base", (2 + hc) * hc, std=0.5)
            normal(f"{b}.hc_{site}_scale", 3, std=0.2, mean=1.0)
        a = f"{b}.attn"
        linear(f"{a}.wq_a", d, qr)
        normal(f"{a}.q_norm.weight", qr, std=0.1, mean=1.0)
        linear(f"{a}.wq_b", qr, cfg.num_attention_heads * hd)
        linear(f"{a}.wkv", d, hd)
        normal(f"{a}.kv_norm.weight", hd, std=0.1, mean=1.0)
        per = cfg.num_attention_heads // cfg.o_groups * hd
        for grp in range(cfg.o_groups):
            linear(f"{a}.wo_a.slice.{grp}", per, cfg.o_lora_rank)
        linear(f"{a}.wo_b", cfg.o_groups * cfg.o_lora_rank, d)
        normal(f"{a}.attn_sink", cfg.num_attention_heads)
        if mode.mode == "full":
            linear(f"{a}.compressor.wkv", d, hd)
            if mode.compress_ratio > 1:
                linear(f"{a}.compressor.wgate", d, hd)
            normal(f"{a}.compressor.norm.weight", hd, std=0.1, mean=1.0)
            linear(f"{a}.indexer.wk", hd, cfg.index_head_dim)
            normal(f"{a}.indexer.k_norm.weight", cfg.index_head_dim, std=0.1, mean=1.0)
        if mode.is_index_source:
            linear(f"{a}.indexer.wq_b", qr, cfg.index_n_heads * cfg.index_head_dim)
            normal(f"{a}.indexer.weights_proj.weight", cfg.index_n_heads, d, std=d**-0.5)
        f = f"{b}.ffn"
        normal(f"{f}.gate.weight", cfg.n_routed_experts, d, std=d**-0.5)
        normal(f"{f}.gate.bias", cfg.n_routed_experts, std=0.1)
        inter = cfg.moe_intermediate_size
        for e in [*(f"experts.{i}" for i in range(cfg.n_routed_experts)), "shared_experts"]:
            linear(f"{f}.{e}.w1", d, inter)
            linear(f"{f}.{e}.w3", d, inter)
            linear(f"{f}.{e}.w2", inter, d)
        if mode.engram:
            e = f"{b}.engram"
            linear(f"{e}.wkv", cfg.engram_cols * cfg.engram_head_dim, (hc + 1) * d)
            normal(f"{e}.q_weight", hc, d, std=0.2, mean=1.0)
            normal(f"{e}.k_weight", hc, d, std=0.2, mean=1.0)
    return w


def random_engram_table(
    cfg: Dsv41Config, rows: int, seed: int = 0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """A random Engram table [rows, head_dim] standing in for one layer's decoded rows."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cfg.engram_head_dim, generator=g, dtype=torch.float64).to(dtype)
