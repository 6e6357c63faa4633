"""DeepSeek-V4.1 text config for the runtime forward: a config dict plus the layer modes prepare recorded."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tfc.packs.deepseek_v41_contract import MODES, LayerMode

from tfc.errors import TfcError

HINT = "re-run `tfc prepare` to rebuild it"


class Dsv41ConfigError(TfcError):
    """A config the DeepSeek-V4.1 forward cannot run."""


class LayerModeError(Dsv41ConfigError):
    """Layer mode records (an image's meta.layer_modes) that are missing or not well-formed."""


@dataclass(frozen=True)
class Dsv41Config:
    """The text_config fields the forward reads (names as in config.json), plus the recorded layer modes."""

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
    candidate_source_layer_id: int | None
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
    dspark_block_size: int = 0  # DSpark drafter (mtp.* blocks); 0 when the model has none
    dspark_noise_token_id: int | None = None
    dspark_target_layer_ids: tuple[int, ...] = ()
    dspark_markov_rank: int = 0
    dspark_n_routed_experts: int = 0
    dspark_num_experts_per_tok: int = 0
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
    "dspark_block_size": 0,
    "dspark_noise_token_id": None,
    "dspark_markov_rank": 0,
}


def config_from_dict(raw: Mapping[str, Any], layer_modes: Any, where: str = "config") -> Dsv41Config:
    """The runtime config from config.json's dict (text keys under text_config or not) and mode records."""
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
    cand = values["candidate_source_layer_id"]
    values.update(
        compress_ratios=ratios,
        kv_source_layer_ids=kv,
        index_source_layer_ids=tuple(int(i) for i in text.get("index_source_layer_ids", kv)),
        candidate_source_layer_id=None if cand is None else int(cand),
        engram_layer_ids=tuple(int(i) for i in values["engram_layer_ids"] or ()),
        bos_token_id=raw.get("bos_token_id", text.get("bos_token_id")),
        eos_token_id=_first(raw.get("eos_token_id", text.get("eos_token_id"))),
        pad_token_id=raw.get("pad_token_id", text.get("pad_token_id")),
        dspark_target_layer_ids=tuple(int(i) for i in text.get("dspark_target_layer_ids") or ()),
        # The drafter's MoE has its own sizes; a config without them falls back to the backbone's.
        dspark_n_routed_experts=int(text.get("dspark_n_routed_experts") or values["n_routed_experts"]),
        dspark_num_experts_per_tok=int(
            text.get("dspark_num_experts_per_tok") or values["num_experts_per_tok"]
        ),
    )
    cfg = Dsv41Config(**values)
    _validate(cfg)
    return replace(cfg, modes=layer_modes_from_records(layer_modes, cfg, where))


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
    for i in c.engram_layer_ids:
        if not 0 <= i < n:
            raise Dsv41ConfigError(f"Engram layer {i} is not a backbone layer")
    if any(not 0 <= i < n for i in c.dspark_target_layer_ids):
        raise Dsv41ConfigError(
            f"dspark_target_layer_ids {list(c.dspark_target_layer_ids)} must lie below {n}"
        )
    if c.dspark_num_experts_per_tok > c.dspark_n_routed_experts:
        raise Dsv41ConfigError("dspark_num_experts_per_tok exceeds dspark_n_routed_experts")


_RECORD: dict[str, tuple[type, ...]] = {
    "layer": (int,),
    "mode": (str,),
    "compress_ratio": (int,),
    "kv_source": (int, type(None)),
    "index_source": (int, type(None)),
    "is_index_source": (bool,),
    "uses_candidates": (bool,),
    "is_candidate_source": (bool,),
    "engram": (bool,),
}


def layer_modes_from_records(records: Any, c: Dsv41Config, where: str = "config") -> tuple[LayerMode, ...]:
    """The backbone layers' `LayerMode`s from their records, refused in one line unless well-formed."""

    def bad(why: str) -> LayerModeError:
        return LayerModeError(f"{where}: {why}; {HINT}")

    n = c.num_hidden_layers
    if records is None:
        raise bad("no layer mode records (meta.layer_modes): the image predates them")
    if type(records) is not list or len(records) != n:
        count = len(records) if type(records) is list else type(records).__name__
        raise bad(f"meta.layer_modes must list {n} layer mode records, one per backbone layer; got {count}")
    modes: list[LayerMode] = []
    for i, rec in enumerate(records):
        if type(rec) is not dict or set(rec) != set(_RECORD):
            raise bad(f"layer mode record {i} is not an object with exactly the keys {', '.join(_RECORD)}")
        for key, kinds in _RECORD.items():
            if type(rec[key]) not in kinds:
                kind = " or ".join(k.__name__ for k in kinds)
                raise bad(f"layer mode record {i}: {key} = {rec[key]!r:.40} is not {kind}")
        mode = LayerMode(**rec)
        why = _mode_problem(mode, i, c, modes)
        if why:
            raise bad(f"layer mode record {i}: {why}")
        modes.append(mode)
    sources = [m.layer for m in modes if m.is_candidate_source]
    want = [] if c.candidate_source_layer_id is None else [c.candidate_source_layer_id]
    if sources != want:
        raise bad(f"the layer mode records name candidate source layers {sources}, the config {want}")
    return tuple(modes)


def _mode_problem(m: LayerMode, i: int, c: Dsv41Config, before: list[LayerMode]) -> str | None:
    """Why record `i` cannot run (it may refer to itself and to the records before it), or None."""
    if m.layer != i:
        return f"is for layer {m.layer}"
    if m.mode not in MODES:
        return f"mode {m.mode!r:.20} is not one of {', '.join(MODES)}"
    if m.compress_ratio != c.compress_ratios[i]:
        return (
            f"compress ratio {m.compress_ratio}, the config's compress_ratios[{i}] = {c.compress_ratios[i]}"
        )
    if m.engram != (i in c.engram_layer_ids):
        return f"engram {m.engram} disagrees with the config's engram_layer_ids {list(c.engram_layer_ids)}"
    if (m.mode == "swa") != (m.compress_ratio == 0):
        return f"mode {m.mode} with compress ratio {m.compress_ratio}"
    if m.mode == "swa":
        if (m.kv_source, m.index_source) != (None, None) or m.is_index_source or m.uses_candidates:
            return "a swa layer has no KV or index source"
        return "a swa layer is no candidate source" if m.is_candidate_source else None
    mine = [*before, m]
    if m.kv_source is None or not 0 <= m.kv_source <= i or mine[m.kv_source].mode != "full":
        return f"KV source {m.kv_source} is not a full layer at or before it"
    if m.index_source is None or not 0 <= m.index_source <= i or not mine[m.index_source].is_index_source:
        return f"index source {m.index_source} is not an index source at or before it"
    if mine[m.kv_source].compress_ratio != m.compress_ratio:
        return f"KV source {m.kv_source} has compress ratio {mine[m.kv_source].compress_ratio}"
    own = {"full": (True, True), "reindex": (False, True), "reuse": (False, False)}[m.mode]
    if (m.kv_source == i, m.index_source == i) != own or m.is_index_source != own[1]:
        return f"a {m.mode} layer with KV source {m.kv_source} and index source {m.index_source}"
    if m.is_candidate_source and (not m.is_index_source or m.uses_candidates):
        return "a candidate source must be an index source that uses no candidates"
    if m.uses_candidates:
        # Candidates are blocks of the candidate source's compressed entries: same KV source, earlier layer.
        sources = [s for s in before if s.is_candidate_source and s.kv_source == m.kv_source]
        if not m.is_index_source or not sources:
            return (
                "uses candidates without an index of its own or a candidate source on its KV source before it"
            )
    return None
