"""Typed DeepSeek-V4.1 config: every text_config field of the spec, validated, and per-layer modes."""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from tfc.packs import deepseek_v41_bounds as bounds
from tfc.packs.deepseek_v41_contract import LayerMode
from tfc.packs.errors import ConfigError
from tfc.packs.files import read_bytes

SUPPORTED_MODEL_TYPES = ("deepseek_v41",)
TEXT_MODEL_TYPES = ("deepseek_v41_text",)
MAX_CONFIG_BYTES = 16 << 20
LIMITS = {
    "num_hidden_layers": 1024, "num_nextn_predict_layers": 64, "n_routed_experts": 16384,
    "dspark_n_routed_experts": 16384, "num_attention_heads": 4096, "o_groups": 1024, "n_shared_experts": 64,
    "hc_mult": 64, "engram_max_ngram_size": 64, "engram_n_heads": 1024,
}  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class DeepseekV41Config:
    """text_config fields (same names as config.json) plus the top-level token ids; lists become tuples."""

    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int = 1
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    hidden_act: str = "silu"
    swiglu_limit: float
    rms_norm_eps: float
    attention_bias: bool = False
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    use_cache: bool = True
    tie_word_embeddings: bool = False
    max_position_embeddings: int
    rope_theta: float
    rope_scaling: dict | None = field(default=None, hash=False)
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    scoring_func: str
    topk_method: str
    norm_topk_prob: bool = True
    routed_scaling_factor: float
    sliding_window: int
    compress_ratios: tuple[int, ...]
    compress_rope_theta: float
    kv_source_layer_ids: tuple[int, ...]
    index_source_layer_ids: tuple[int, ...]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    candidate_source_layer_id: int | None = None
    candidate_topk_blocks: int
    candidate_block_size: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    engram_layer_ids: tuple[int, ...]
    engram_num_embeddings: tuple[int, ...]
    engram_max_ngram_size: int
    engram_vocab_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_pad_token_id: int
    engram_compressed_vocab_size: int
    num_nextn_predict_layers: int
    dspark_block_size: int
    dspark_noise_token_id: int
    dspark_target_layer_ids: tuple[int, ...]
    dspark_markov_rank: int
    dspark_n_routed_experts: int
    dspark_num_experts_per_tok: int
    # top level (or text_config), with the defaults every port applies
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int | None = None
    image_token_id: int | None = None
    hc_post_alpha: float = 2.0
    engram_gate_clamp: float = 1e-6
    # informational
    model_type: str = "deepseek_v41"
    architectures: tuple[str, ...] = ()
    quantization_config: dict | None = field(default=None, hash=False)
    engram_table_dir: str | None = None

    @property
    def num_blocks(self) -> int:
        """Backbone layers plus DSpark (MTP) blocks."""
        return self.num_hidden_layers + self.num_nextn_predict_layers

    def block_prefix(self, block: int) -> str:
        """Tensor-name prefix of a block: "layers.{b}" or "mtp.{b - layers}"."""
        if not 0 <= block < self.num_blocks:
            raise ConfigError(f"block {block} is outside 0..{self.num_blocks - 1}")
        layers = self.num_hidden_layers
        return f"layers.{block}" if block < layers else f"mtp.{block - layers}"

    def is_dspark(self, block: int) -> bool:
        """Whether a block is a DSpark (MTP) block."""
        return block >= self.num_hidden_layers

    def num_experts(self, block: int) -> int:
        """Routed experts of a block (DSpark blocks have their own count)."""
        return self.dspark_n_routed_experts if self.is_dspark(block) else self.n_routed_experts

    def experts_per_token(self, block: int) -> int:
        """Routed experts each token selects in a block."""
        return self.dspark_num_experts_per_tok if self.is_dspark(block) else self.num_experts_per_tok

    @property
    def shared_expert_width(self) -> int:
        """Intermediate width of a block's shared expert."""
        return self.moe_intermediate_size * self.n_shared_experts

    @property
    def engram_columns(self) -> int:
        """Engram hash columns per position: (max n-gram - 1) orders x heads."""
        return (self.engram_max_ngram_size - 1) * self.engram_n_heads

    def layer_mode(self, layer: int) -> LayerMode:
        """The attention mode of a block (spec deepseek_v41.md section 2); DSpark blocks are swa."""
        if not 0 <= layer < self.num_blocks:
            raise ConfigError(f"layer {layer} is outside 0..{self.num_blocks - 1}")
        engram = layer in self.engram_layer_ids
        ratio = self.compress_ratios[layer] if layer < len(self.compress_ratios) else 0
        if self.is_dspark(layer) or ratio == 0:
            return LayerMode(layer, "swa", ratio, None, None, False, False, False, engram)
        kv = max(s for s in self.kv_source_layer_ids if s <= layer)
        index = max(s for s in self.index_source_layer_ids if s <= layer)
        if layer in self.kv_source_layer_ids:
            mode = "full"
        elif layer in self.index_source_layer_ids:
            mode = "reindex"
        else:
            mode = "reuse"
        # Candidates are blocks of the candidate source's compressed entries: only a reindex layer scoring
        # that same KV source can use them (a full layer or another KV source's layers have other keys).
        cand = self.candidate_source_layer_id
        uses = mode == "reindex" and kv == cand
        return LayerMode(layer, mode, ratio, kv, index, index == layer, uses, layer == cand, engram)

    def layer_mode_records(self) -> list[dict[str, Any]]:
        """Every backbone layer's mode as a plain JSON object (what a prepared image carries)."""
        return [asdict(self.layer_mode(layer)) for layer in range(self.num_hidden_layers)]


_KIND = {
    "int": "int", "float": "num", "bool": "bool", "str": "str", "tuple[int, ...]": "ints",
    "tuple[str, ...]": "strs", "dict | None": "dict?", "int | None": "int?", "str | None": "str?",
}  # fmt: skip
_TOP_LEVEL = ("bos_token_id", "eos_token_id", "pad_token_id", "image_token_id")
_ALIASES = {"engram_pad_token_id": "engram_pad_id"}  # the HF config class's name


def load_config(path: Path | str) -> DeepseekV41Config:
    """Read and validate config.json (text keys nested under text_config or at the top level)."""
    path = Path(path)
    data = read_bytes(path, MAX_CONFIG_BYTES, ConfigError)
    try:
        raw = json.loads(data.decode("utf-8"))
    except RecursionError:
        raise ConfigError(f"{path}: JSON nested more than {bounds.MAX_DEPTH} levels deep") from None
    except ValueError as error:
        raise ConfigError(f"{path}: not valid UTF-8 JSON ({str(error)[:120]})") from None
    return config_from_dict(raw, path.name)


def config_from_dict(raw: Any, where: str = "config.json") -> DeepseekV41Config:
    """Build and validate the config from config.json's parsed dict."""
    if type(raw) is not dict:
        raise ConfigError(f"{where}: top level is not a JSON object")
    bounds.check_json(raw, where)
    text = raw.get("text_config", raw)
    if type(text) is not dict:
        raise ConfigError(f"{where}: text_config is not a JSON object")
    model_type = raw.get("model_type", None if "text_config" in raw else text.get("model_type"))
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"{where}: model_type {model_type!r:.60} is not supported (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if text is not raw and text.get("model_type", TEXT_MODEL_TYPES[0]) not in TEXT_MODEL_TYPES:
        raise ConfigError(
            f"{where}: text_config.model_type {text.get('model_type')!r:.60} is not deepseek_v41_text"
        )
    values: dict[str, Any] = {}
    for f in fields(DeepseekV41Config):
        found = _lookup(f.name, (raw, text) if f.name in _TOP_LEVEL else (text, raw))
        if found is None:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ConfigError(f"{where}: text_config has no {f.name!r}")
            continue
        values[f.name] = _typed(where, f.name, _KIND[f.type], found[0])
    values["model_type"] = model_type
    config = DeepseekV41Config(**values)
    _check(config, where)
    return config


def _lookup(name: str, sources: tuple[dict, ...]) -> tuple[Any] | None:
    for source in sources:
        for key in (name, _ALIASES.get(name)):
            if key in source:
                return (source[key],)
    return None


def _typed(where: str, name: str, kind: str, value: Any) -> Any:
    if value is None and kind.endswith("?"):
        return None
    kind = kind.rstrip("?")
    ok = {
        "int": type(value) is int,
        "num": type(value) in (int, float),
        "bool": type(value) is bool,
        "str": type(value) is str,
        "dict": type(value) is dict,
        "ints": type(value) is list and all(type(v) is int for v in value),
        "strs": type(value) is list and all(type(v) is str for v in value),
    }[kind]
    if not ok:
        raise ConfigError(f"{where}: {name} = {value!r:.80} is not of type {kind}")
    if kind == "num":
        return float(value)
    if kind in ("int", "ints"):
        bounds.check_ints(where, name, value if kind == "ints" else (value,))
    return tuple(value) if kind in ("ints", "strs") else value


def _check(c: DeepseekV41Config, where: str) -> None:
    """The validation rules of spec deepseek_v41.md section 1.5, plus what the plan relies on."""

    def need(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(f"{where}: {message}")

    for name in (
        "vocab_size", "hidden_size", "moe_intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "q_lora_rank", "o_lora_rank", "o_groups", "n_routed_experts",
        "n_shared_experts", "num_experts_per_tok", "sliding_window", "index_n_heads", "index_head_dim",
        "index_topk", "candidate_topk_blocks", "candidate_block_size", "hc_mult", "hc_sinkhorn_iters",
        "engram_max_ngram_size", "engram_vocab_size", "engram_n_heads", "engram_head_dim",
        "engram_compressed_vocab_size", "dspark_block_size", "dspark_markov_rank", "dspark_n_routed_experts",
        "dspark_num_experts_per_tok", "max_position_embeddings",
    ):  # fmt: skip
        need(getattr(c, name) > 0, f"{name} must be positive, got {getattr(c, name)}")
    need(c.num_nextn_predict_layers >= 0, "num_nextn_predict_layers must be >= 0")
    bounds.check_ranges(c, where)
    for name, cap in LIMITS.items():  # hostile configs: bound what sizes the expected tensor list
        need(getattr(c, name) <= cap, f"{name} {getattr(c, name)} exceeds the supported maximum {cap}")
    for name in ("hidden_size", "moe_intermediate_size", "vocab_size"):
        need(getattr(c, name) % 128 == 0, f"{name} {getattr(c, name)} is not a multiple of 128")
    need(
        c.num_attention_heads % c.o_groups == 0,
        f"{c.num_attention_heads} heads do not divide into {c.o_groups} o_groups",
    )
    need(
        0 <= c.qk_rope_head_dim <= c.head_dim,
        f"qk_rope_head_dim {c.qk_rope_head_dim} exceeds head_dim {c.head_dim}",
    )
    need(c.num_experts_per_tok <= c.n_routed_experts, "num_experts_per_tok exceeds n_routed_experts")
    need(
        c.dspark_num_experts_per_tok <= c.dspark_n_routed_experts,
        "dspark_num_experts_per_tok exceeds dspark_n_routed_experts",
    )
    need(
        c.scoring_func == "sqrtsoftplus",
        f"scoring_func {c.scoring_func!r} is not supported (only sqrtsoftplus)",
    )
    need(c.topk_method == "noaux_tc", f"topk_method {c.topk_method!r} is not supported (only noaux_tc)")
    need(c.hidden_act == "silu", f"hidden_act {c.hidden_act!r} is not supported (only silu)")
    layers, ratios = c.num_hidden_layers, c.compress_ratios
    need(
        all(r in (0, 1, 2) for r in ratios),
        f"compress_ratios may hold only 0, 1 and 2, got {sorted(set(ratios))}",
    )
    need(len(ratios) >= layers, f"compress_ratios has {len(ratios)} entries, fewer than {layers} layers")
    need(not any(ratios[layers : c.num_blocks]), "DSpark blocks must have compress ratio 0 (sliding window)")
    for name in ("kv_source_layer_ids", "index_source_layer_ids"):
        ids = getattr(c, name)
        need(list(ids) == sorted(set(ids)), f"{name} must be strictly increasing")
        for s in ids:
            need(0 <= s < layers and ratios[s] != 0, f"{name}: {s} is not a compressed layer below {layers}")
    need(
        set(c.kv_source_layer_ids) <= set(c.index_source_layer_ids),
        "every KV source must also be an index source",
    )
    for layer in range(layers):
        if ratios[layer]:
            kv = [s for s in c.kv_source_layer_ids if s <= layer]
            index = [s for s in c.index_source_layer_ids if s <= layer]
            need(
                bool(kv) and bool(index),
                f"compressed layer {layer} has no KV or index source at or before it",
            )
            need(
                ratios[kv[-1]] == ratios[layer],
                f"layer {layer} (ratio {ratios[layer]}) reuses KV source {kv[-1]} of another ratio",
            )
    cand = c.candidate_source_layer_id
    need(
        cand is None or cand in c.kv_source_layer_ids,
        f"candidate_source_layer_id {cand} is not a KV source layer",
    )
    need(
        len(c.engram_layer_ids) == len(c.engram_num_embeddings),
        "engram_layer_ids and engram_num_embeddings differ in length",
    )
    need(len(set(c.engram_layer_ids)) == len(c.engram_layer_ids), "engram_layer_ids repeat a layer")
    need(all(0 <= e < layers for e in c.engram_layer_ids), f"engram_layer_ids must lie below {layers}")
    need(all(n > 0 for n in c.engram_num_embeddings), "engram_num_embeddings must be positive")
    need(c.engram_max_ngram_size >= 2, "engram_max_ngram_size must be at least 2")
    need(
        c.engram_head_dim % 32 == 0,
        f"engram_head_dim {c.engram_head_dim} is not a multiple of 32 (one scale per 32)",
    )
    need(
        all(0 <= t < layers for t in c.dspark_target_layer_ids),
        f"dspark_target_layer_ids must lie below {layers}",
    )
    need(
        c.num_nextn_predict_layers == 0 or bool(c.dspark_target_layer_ids),
        "DSpark blocks need dspark_target_layer_ids",
    )
    for name in (
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "image_token_id",
        "dspark_noise_token_id",
        "engram_pad_token_id",
    ):
        value = getattr(c, name)
        need(
            value is None or 0 <= value < c.vocab_size,
            f"{name} {value} is outside the vocabulary of {c.vocab_size}",
        )
