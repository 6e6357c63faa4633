"""The tiny pack covers what the brief asks of it, byte for byte deterministic for a seed."""

from __future__ import annotations

import hashlib
import json
from collections import Counter

import numpy as np
from tfc.fixtures.tiny import write_tiny
from tfc.packs.pack import open_pack, read_tensor
from tokenizers import Tokenizer


def digests(pack) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(pack.iterdir())}


def test_same_seed_same_bytes_other_seed_other_values(tiny_pack, tmp_path):
    again = write_tiny(tmp_path / "again", seed=0)
    assert digests(again) == digests(tiny_pack)
    other = digests(write_tiny(tmp_path / "other", seed=1))
    same = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"}
    assert all((other[n] == d) == (n in same) for n, d in digests(tiny_pack).items())


def test_every_mode_codebook_and_width_kind_is_present(tiny_pack):
    pack = open_pack(tiny_pack)
    cfg = pack.config
    modes = Counter((m.mode, m.compress_ratio) for m in map(cfg.layer_mode, range(cfg.num_hidden_layers)))
    assert {("swa", 0), ("full", 2), ("full", 1), ("reuse", 2), ("reuse", 1), ("reindex", 1)} <= set(modes)
    assert any(cfg.layer_mode(b).uses_candidates for b in range(cfg.num_blocks))
    assert cfg.num_nextn_predict_layers == 3 and len(cfg.engram_layer_ids) == 2
    groups = pack.groups.values()
    assert {g.codebook for g in groups} == {"3inst", "mcg", "mul1"}
    assert all(g.codebook == "mul1" for g in groups if g.width % 16)
    assert any(g.bits == 2.5 for g in groups)
    for block in range(cfg.num_blocks):
        p = cfg.block_prefix(block)
        w = {
            proj: [pack.groups[f"{p}.ffn.experts.{e}.{proj}"].width for e in range(cfg.num_experts(block))]
            for proj in ("w1", "w3", "w2")
        }
        assert f"{p}.ffn.shared_experts.w2" in pack.groups
        if block in (0, 1, 4, 6) or block >= 8:
            assert all(len(set(v)) == 1 for v in w.values()), block
        else:
            assert len(set(w["w1"])) > 1 and w["w1"] != w["w3"], block


def test_dimensions_split_on_128_blocks_for_tp_1_2_4(tiny_pack):
    cfg = open_pack(tiny_pack).config
    for dim in (cfg.hidden_size, cfg.moe_intermediate_size, cfg.vocab_size, cfg.q_lora_rank, cfg.o_lora_rank):
        assert dim % 128 == 0
    assert cfg.moe_intermediate_size // 128 % 2 == 1 and cfg.vocab_size // 128 % 4 != 0  # uneven splits exist
    for world in (1, 2, 4):
        assert cfg.num_attention_heads % world == 0 and cfg.o_groups % world == 0
        assert cfg.moe_intermediate_size // 128 >= world and cfg.vocab_size // 128 >= world
    assert cfg.index_n_heads == 16 and cfg.engram_columns % 4 == 0


def test_payloads_are_random_and_never_zero(tiny_pack):
    pack = open_pack(tiny_pack)
    for name in ("layers.2.ffn.experts.5.w3", "head", "mtp.1.attn.wq_b", "layers.1.engram.wkv"):
        g = pack.groups[name]
        t, suh, svh = read_tensor(g.trellis), read_tensor(g.suh), read_tensor(g.svh)
        assert t.std() > 10000 and np.all(suh != 0) and np.all(svh != 0)
        assert 0.005 < float(np.abs(suh.astype(np.float32)).mean()) < 0.05
    for name, info in pack.natives.items():
        arr = read_tensor(info, as_float=True)
        assert (arr.size and np.count_nonzero(arr) == arr.size) or info.dtype.startswith("F8"), name


def test_tokenizer_roles_and_size(tiny_pack):
    cfg = open_pack(tiny_pack).config
    raw = json.loads((tiny_pack / "config.json").read_text())
    tok = Tokenizer.from_file(str(tiny_pack / "tokenizer.json"))
    assert tok.get_vocab_size() <= cfg.vocab_size
    ids = {t: tok.token_to_id(t) for t in ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>")}
    assert list(ids.values()) == [cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id] == [0, 1, 2]
    assert tok.token_to_id("<｜deepseek_image｜>") == cfg.image_token_id == raw["image_token_id"]
    assert tok.token_to_id("<｜System｜>") == cfg.dspark_noise_token_id
    for special in ("<｜User｜>", "<｜Assistant｜>", "<think>", "</think>"):
        assert tok.token_to_id(special) is not None and tok.token_to_id(special) < cfg.vocab_size
    enc = tok.encode("<｜User｜>Hello there, 2048 tokens!<｜Assistant｜><think>")
    assert enc.ids[0] == tok.token_to_id("<｜User｜>") and enc.ids[-1] == tok.token_to_id("<think>")
    assert (
        tok.decode(enc.ids, skip_special_tokens=False)
        == "<｜User｜>Hello there, 2048 tokens!<｜Assistant｜><think>"
    )
