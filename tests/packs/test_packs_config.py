"""The typed DeepSeek-V4.1 config: spec values, layer modes (spec section 2), validation rules."""

from __future__ import annotations

import copy

import pytest
from tfc.fixtures.flash_headers import flash_config
from tfc.fixtures.tiny import tiny_config
from tfc.packs.deepseek_v41_config import config_from_dict, load_config
from tfc.packs.deepseek_v41_names import block_groups, block_natives
from tfc.packs.errors import ConfigError

# Spec deepseek_v41.md section 2, the table of modes: layer -> (mode, ratio, kv source, index source, candidates)
FLASH_MODES = {0: ("swa", 0, None, None, False), 1: ("swa", 0, None, None, False)}
FLASH_MODES |= {2: ("full", 2, 2, 2, False), 8: ("full", 2, 8, 8, False), 14: ("full", 2, 14, 14, False)}
FLASH_MODES |= {x: ("reuse", 2, s, s, False) for s in (2, 8, 14) for x in range(s + 1, s + 6)}
FLASH_MODES |= {20: ("full", 1, 20, 20, False)} | {x: ("reuse", 1, 20, 20, False) for x in (21, 22, 23)}
FLASH_MODES |= {s: ("reindex", 1, 20, s, True) for s in (24, 28, 32, 36)}
FLASH_MODES |= {x: ("reuse", 1, 20, s, False) for s in (24, 28, 32, 36) for x in range(s + 1, s + 4)}
FLASH_MODES |= {x: ("swa", 0, None, None, False) for x in (40, 41, 42)}


def test_flash_layer_modes_match_the_spec_table():
    cfg = config_from_dict(flash_config())
    assert cfg.num_blocks == 43 and sorted(FLASH_MODES) == list(range(43))
    for layer, (mode, ratio, kv, index, cands) in FLASH_MODES.items():
        m = cfg.layer_mode(layer)
        assert (m.mode, m.compress_ratio, m.kv_source, m.index_source, m.uses_candidates) == (
            mode,
            ratio,
            kv,
            index,
            cands,
        ), layer
        assert m.engram == (layer in (1, 14))
    assert [cfg.block_prefix(b) for b in (0, 39, 40, 42)] == ["layers.0", "layers.39", "mtp.0", "mtp.2"]
    assert cfg.num_experts(39) == 384 and cfg.num_experts(40) == 128 and cfg.experts_per_token(41) == 3
    assert cfg.hc_post_alpha == 2.0 and cfg.engram_gate_clamp == 1e-6 and cfg.image_token_id == 129264
    assert cfg.rms_norm_eps == 1e-20 and cfg.rope_scaling["factor"] == 16 and cfg.engram_columns == 24


def test_flash_block_shapes_match_the_spec():
    cfg = config_from_dict(flash_config())
    groups = {g.kind: (g.k, g.n, len(g.names)) for g in block_groups(cfg, 14)}
    assert groups["attn.wq_b"] == (1280, 32768, 1) and groups["attn.wo_a"] == (4096, 1024, 8)
    assert groups["attn.wo_b"] == (8192, 5120, 1) and groups["attn.indexer.wk"] == (512, 128, 1)
    assert groups["attn.indexer.wq_b"] == (1280, 4096, 1) and groups["engram.wkv"] == (6144, 25600, 1)
    assert groups["ffn.experts.w1"] == (5120, 2304, 384) and groups["ffn.experts.w2"] == (2304, 5120, 384)
    assert "attn.compressor.wgate" in groups and "attn.compressor.wgate" not in {
        g.kind for g in block_groups(cfg, 20)
    }
    natives = {n.name: n.shapes[0] for n in block_natives(cfg, 24)}
    assert natives["layers.24.hc_attn_fn"] == (24, 20480) and natives[
        "layers.24.attn.indexer.weights_proj.weight"
    ] == (32, 5120)
    assert "layers.24.attn.indexer.k_norm.weight" not in natives and natives["layers.24.ffn.gate.weight"] == (
        384,
        5120,
    )
    assert {n.name: n.shapes[0] for n in block_natives(cfg, 41)}["mtp.1.ffn.gate.bias"] == (128,)


def test_tiny_modes_cover_every_case():
    cfg = config_from_dict(tiny_config())
    modes = [cfg.layer_mode(b) for b in range(cfg.num_blocks)]
    assert [m.mode for m in modes] == ["swa", "swa", "full", "reuse", "full", "reuse", "reindex", "reuse"] + [
        "swa"
    ] * 3
    assert {m.compress_ratio for m in modes if m.mode == "full"} == {1, 2}
    assert modes[6].uses_candidates and modes[7].index_source == 6 and modes[7].kv_source == 4
    assert (
        [m.layer for m in modes if m.engram] == [1, 2] and modes[1].mode == "swa" and modes[2].mode == "full"
    )


def test_top_level_keys_without_text_config(tmp_path):
    raw = tiny_config()
    flat = {**raw.pop("text_config"), **raw, "model_type": "deepseek_v41"}
    cfg = config_from_dict(flat)
    assert cfg.hidden_size == 256 and cfg.bos_token_id == 0


def test_load_config_reads_file(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps(flash_config()))
    assert load_config(tmp_path / "config.json").n_routed_experts == 384
    (tmp_path / "bad.json").write_bytes(b"\xff{")
    with pytest.raises(ConfigError, match="not valid UTF-8 JSON"):
        load_config(tmp_path / "bad.json")


def _broken(change) -> dict:
    raw = copy.deepcopy(flash_config())
    change(raw, raw["text_config"])
    return raw


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda r, t: r.__setitem__("model_type", "llama"),
            r"model_type 'llama' is not supported \(supported: deepseek_v41\)",
        ),
        (lambda r, t: t.pop("hidden_size"), "no 'hidden_size'"),
        (lambda r, t: t.__setitem__("hidden_size", "5120"), "hidden_size = '5120' is not of type int"),
        (lambda r, t: t.__setitem__("hidden_size", 5000), "hidden_size 5000 is not a multiple of 128"),
        (lambda r, t: t.__setitem__("o_groups", 7), "64 heads do not divide into 7 o_groups"),
        (lambda r, t: t.__setitem__("qk_rope_head_dim", 1024), "exceeds head_dim"),
        (lambda r, t: t.__setitem__("num_experts_per_tok", 400), "num_experts_per_tok exceeds"),
        (lambda r, t: t["compress_ratios"].__setitem__(5, 4), "compress_ratios may hold only 0, 1 and 2"),
        (lambda r, t: t.__setitem__("compress_ratios", [0] * 30), "fewer than 40 layers"),
        (
            lambda r, t: t.__setitem__("kv_source_layer_ids", [1, 8, 14, 20]),
            "kv_source_layer_ids: 1 is not a compressed layer",
        ),
        (lambda r, t: t.__setitem__("kv_source_layer_ids", [8, 14, 20]), "layer 2 has no KV or index source"),
        (
            lambda r, t: t.__setitem__("index_source_layer_ids", [2, 8, 14, 24]),
            "every KV source must also be an index source",
        ),
        (
            lambda r, t: t.__setitem__("kv_source_layer_ids", [2, 8, 14, 24]),
            "reuses KV source 14 of another ratio",
        ),
        (lambda r, t: t.__setitem__("engram_num_embeddings", [1]), "differ in length"),
        (lambda r, t: t.__setitem__("candidate_source_layer_id", 24), "not a KV source layer"),
        (lambda r, t: t.__setitem__("scoring_func", "softmax"), "only sqrtsoftplus"),
        (lambda r, t: r.__setitem__("image_token_id", 200000), "outside the vocabulary"),
        (lambda r, t: t.__setitem__("dspark_target_layer_ids", [37, 38, 45]), "must lie below 40"),
        (lambda r, t: t.__setitem__("n_routed_experts", 10**9), "exceeds the supported maximum"),
    ],
)
def test_config_validation(change, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(_broken(change))


def test_engram_pad_alias_and_defaults():
    raw = tiny_config()
    raw["text_config"]["engram_pad_id"] = raw["text_config"].pop("engram_pad_token_id")
    raw["text_config"]["hc_post_alpha"] = 1.5
    cfg = config_from_dict(raw)
    assert cfg.engram_pad_token_id == 2 and cfg.hc_post_alpha == 1.5
