"""flash-headers: DeepSeek-V4.1-Flash geometry, real headers, payloads as holes."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from tfc.fixtures.flash_headers import write_flash_headers
from tfc.packs.pack import open_pack


@pytest.fixture(scope="module")
def pack(flash_headers_pack):
    return open_pack(flash_headers_pack)


def test_geometry_and_sizes(flash_headers_pack, pack):
    shards = sorted(flash_headers_pack.glob("model-*.safetensors"))
    engram = sorted(flash_headers_pack.glob("engram-*.safetensors"))
    assert len(shards) == 44 and len(pack.shards) == 46 and len(engram) == 2
    assert 185_000 <= len(pack.table.names) <= 195_000
    apparent = sum(p.stat().st_size for p in shards)
    on_disk = sum(p.stat().st_blocks * 512 for p in [*shards, *engram])
    assert 190e9 < apparent < 215e9 and on_disk < 200e6, "payloads are holes"
    # DeepSeek's two real-size Engram table files (engram.md section 8; sizes from deepseek_v41.md section 5)
    assert [p.stat().st_size for p in engram] == [101_377_628_616, 101_380_404_312]
    assert pack.tensors["layers.14.engram.embed.weight"].shape == (384016682, 256)
    assert pack.tensors["layers.1.engram.embed.scale"].dtype == "F8_E8M0"
    groups = pack.groups
    assert groups["layers.0.ffn.experts.0.w1"].trellis.shape[:2] == (320, 144)
    assert groups["layers.0.ffn.experts.0.w2"].trellis.shape[:2] == (144, 320)
    assert groups["layers.2.attn.indexer.wk"].trellis.shape == (32, 8, 128)
    assert groups["head"].trellis.shape == (320, 8080, 96)
    assert {g.codebook for g in groups.values()} == {"mul1"}


def test_expert_widths_follow_q28_v2_ranges(pack):
    ranges = {
        range(0, 4): {2, 3, 4, 5},
        range(4, 36): {2, 3, 4, 5, 6},
        range(36, 40): {3, 4, 5, 6},
        range(40, 43): {4},
    }
    for rec in pack.records:
        if rec.spec.kind.startswith("ffn.experts."):
            bits = {w // 16 for w in rec.widths}
            allowed = next(v for r, v in ranges.items() if rec.spec.block in r)
            assert bits <= allowed, (rec.spec.block, rec.spec.kind)
            if rec.spec.block < 40:
                assert len(bits) > 2, "mixed per-expert widths"
    gate_up = Counter(
        pack.groups[f"layers.9.ffn.experts.{e}.w1"].width == pack.groups[f"layers.9.ffn.experts.{e}.w3"].width
        for e in range(384)
    )
    assert gate_up[False] > 50, "gate and up widths differ for many experts"
    shared = {
        b: pack.groups[f"{pack.config.block_prefix(b)}.ffn.shared_experts.w1"].bits for b in (0, 3, 4, 39, 40)
    }
    assert shared == {0: 5, 3: 5, 4: 6, 39: 6, 40: 4}


def test_builds_in_seconds(tmp_path):
    t0 = time.perf_counter()
    write_flash_headers(tmp_path / "flash")
    assert time.perf_counter() - t0 < 15
