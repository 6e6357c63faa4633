"""DeepSeek-V4.1 text config for the runtime forward, built from a plain config dict (never from packs)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tfc.errors import TfcError

MODES = ("swa", "full", "reindex", "reuse")


class Dsv41ConfigError(TfcError):
    """A config the DeepSeek-V4.1 forward cannot run."""


@dataclass(frozen=True)
class LayerMode:
    """How one backbone layer attends: its CSA2 mode and the layers whose state it reads."""

    layer: int
    mode: str  # swa | full | reindex | reuse
    compress_ratio: int
    kv_source: int | None
    index_source: int | None
    is_index_source: bool
    uses_candidates: bool
    is_candidate_source: bool
    engram: bool


@dataclass(frozen=True)
class Dsv41Config:
    """The text_config fields the forward reads (names as in config.json), plus derived layer modes."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    swiglu_limit: float
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    sliding_window: int
    compress_ratios: tuple[int, ...]
    kv_source_layer_ids: tuple[int, ...]
    index_source_layer_ids: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    candidate_source_layer_id: int
    candidate_topk_blocks: int
    candidate_block_size: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    hc_post_alpha: float
    engram_layer_ids: tuple[int, ...]
    engram_max_ngram_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_gate_clamp: float
    num_nextn_predict_layers: int
    scoring_func: str
    topk_method: str
    bos_token_id: int | None
    eos_token_id: int | None
    pad_token_id: int | None
    modes: tuple[LayerMode, ...] = field(default=(), compare=False)

    @property
    def engram_cols(self) -> int:
        """Table rows looked up per token and Engram layer: (max_ngram - 1) x heads."""
        return (self.engram_max_ngram_size - 1) * self.engram_n_heads

    def layer_mode(self, layer: int) -> LayerMode:
        """The CSA2 mode of backbone layer `layer`."""
        return self.modes[layer]


_INT = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "head_dim",
    "qk_rope_head_dim",
    "q_lora_rank",
    "o_lora_rank",
    "o_groups",
    "moe_intermediate_size",
    "n_routed_experts",
    "num_experts_per_tok",
    "sliding_window",
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    "hc_mult",
)
_DEFAULTS: dict[str, Any] = {
    "n_shared_experts": 1,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "compress_rope_theta": 160000.0,
    "rope_scaling": None,
    "max_position_embeddings": 1 << 20,
    "candidate_source_layer_id": None,
    "candidate_topk_blocks": 2048,
    "candidate_block_size": 8,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-6,
    "hc_post_alpha": 2.0,
    "engram_layer_ids": (),
    "engram_max_ngram_size": 4,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_gate_clamp": 1e-6,
    "num_nextn_predict_layers": 0,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
}


def config_from_dict(raw: Mapping[str, Any]) -> Dsv41Config:
    """Build the runtime config from config.json's dict (text keys nested under text_config or not)."""
    text = raw.get("text_config", raw)
    if not isinstance(text, Mapping):
        raise Dsv41ConfigError("config text_config is not an object")
    missing = [k for k in (*_INT, "compress_ratios") if k not in text]
    if missing:
        raise Dsv41ConfigError(f"config lacks DeepSeek-V4.1 keys: {', '.join(missing)}")
    values: dict[str, Any] = {k: int(text[k]) for k in _INT}
    for key, default in _DEFAULTS.items():
        values[key] = text.get(key, default)
    n = values["num_hidden_layers"]
    ratios = tuple(int(r) for r in text["compress_ratios"])
    if len(ratios) < n or any(r not in (0, 1, 2) for r in ratios):
        raise Dsv41ConfigError(f"compress_ratios must hold {n}+ entries of 0, 1 or 2; got {list(ratios)}")
    kv = tuple(int(i) for i in text.get("kv_source_layer_ids", ()))
    ix = tuple(int(i) for i in text.get("index_source_layer_ids", kv))
    cand = values["candidate_source_layer_id"]
    values["candidate_source_layer_id"] = (kv[-1] if kv else -1) if cand is None else int(cand)
    values.update(
        compress_ratios=ratios,
        kv_source_layer_ids=kv,
        index_source_layer_ids=ix,
        engram_layer_ids=tuple(int(i) for i in values["engram_layer_ids"] or ()),
        bos_token_id=raw.get("bos_token_id", text.get("bos_token_id")),
        eos_token_id=_first(raw.get("eos_token_id", text.get("eos_token_id"))),
        pad_token_id=raw.get("pad_token_id", text.get("pad_token_id")),
    )
    cfg = Dsv41Config(**values)
    _validate(cfg)
    return _with_modes(cfg)


def _first(value: Any) -> int | None:
    if isinstance(value, list | tuple):
        return int(value[0]) if value else None
    return None if value is None else int(value)


def _validate(c: Dsv41Config) -> None:
    n = c.num_hidden_layers
    if c.scoring_func != "sqrtsoftplus" or c.topk_method != "noaux_tc":
        raise Dsv41ConfigError(f"routing {c.scoring_func}/{c.topk_method} is not sqrtsoftplus/noaux_tc")
    if c.num_attention_heads % c.o_groups:
        raise Dsv41ConfigError(f"{c.num_attention_heads} heads do not divide into {c.o_groups} o_groups")
    if c.qk_rope_head_dim > c.head_dim or c.qk_rope_head_dim % 2 or c.qk_rope_head_dim > c.index_head_dim:
        raise Dsv41ConfigError(f"qk_rope_head_dim {c.qk_rope_head_dim} does not fit the head dims")
    if c.num_experts_per_tok > c.n_routed_experts:
        raise Dsv41ConfigError("num_experts_per_tok exceeds n_routed_experts")
    for i in c.kv_source_layer_ids + c.index_source_layer_ids:
        if not 0 <= i < n or c.compress_ratios[i] == 0:
            raise Dsv41ConfigError(f"source layer {i} is not a compressed backbone layer")
    for i in range(n):
        if c.compress_ratios[i] and not any(s <= i for s in c.kv_source_layer_ids):
            raise Dsv41ConfigError(f"compressed layer {i} has no KV source at or before it")
        if c.compress_ratios[i] and not any(s <= i for s in c.index_source_layer_ids):
            raise Dsv41ConfigError(f"compressed layer {i} has no index source at or before it")
    cand = c.candidate_source_layer_id
    if cand >= 0 and cand not in c.index_source_layer_ids:
        raise Dsv41ConfigError(f"candidate source {cand} is not an index source")
    for i in c.engram_layer_ids:
        if not 0 <= i < n:
            raise Dsv41ConfigError(f"Engram layer {i} is not a backbone layer")


def _with_modes(c: Dsv41Config) -> Dsv41Config:
    modes = []
    for layer in range(c.num_hidden_layers):
        ratio = c.compress_ratios[layer]
        kv = max((s for s in c.kv_source_layer_ids if s <= layer), default=None) if ratio else None
        ix = max((s for s in c.index_source_layer_ids if s <= layer), default=None) if ratio else None
        if not ratio:
            mode = "swa"
        elif layer in c.kv_source_layer_ids:
            mode = "full"
        elif layer in c.index_source_layer_ids:
            mode = "reindex"
        else:
            mode = "reuse"
        is_ix = layer in c.index_source_layer_ids
        cand = c.candidate_source_layer_id
        modes.append(
            LayerMode(
                layer=layer,
                mode=mode,
                compress_ratio=ratio,
                kv_source=kv,
                index_source=ix,
                is_index_source=is_ix,
                uses_candidates=is_ix and 0 <= cand < layer,
                is_candidate_source=layer == cand,
                engram=layer in c.engram_layer_ids,
            )
        )
    object.__setattr__(c, "modes", tuple(modes))
    return c
