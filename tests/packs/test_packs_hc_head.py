"""The V4 mHC head tensors are optional in a V4.1 pack: packs without them and with them both plan."""

from __future__ import annotations

import json
import shutil

import numpy as np
from tfc.compiler.dsv41_plan import plan_rank
from tfc.fixtures.safetensors_writer import write_file
from tfc.packs.pack import open_pack, read_tensor
from tfc.packs.safetensors_header import read_header

HC_HEAD = ("hc_head_fn", "hc_head_base", "hc_head_scale")


def test_pack_without_hc_head_opens_and_plans(tiny_pack):
    pack = open_pack(tiny_pack)
    assert not any(name in pack.tensors for name in HC_HEAD)
    names = {s.name for s in plan_rank(pack, 1, 0).segments}
    assert "norm.weight" in names


def test_pack_with_hc_head_plans_them_as_f32_natives(tiny_pack, tmp_path):
    pack_dir = tmp_path / "pack"
    shutil.copytree(tiny_pack, pack_dir)
    index_path = pack_dir / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    shard = pack_dir / index["weight_map"]["norm.weight"]
    header = read_header(shard)
    cfg = open_pack(tiny_pack).config
    hc, d = cfg.hc_mult, cfg.hidden_size
    rng = np.random.default_rng(5)
    extra = [
        ("hc_head_fn", "F32", (hc, hc * d), rng.standard_normal((hc, hc * d), dtype=np.float32).tobytes()),
        ("hc_head_base", "F32", (hc,), rng.standard_normal(hc, dtype=np.float32).tobytes()),
        ("hc_head_scale", "F32", (1,), rng.standard_normal(1, dtype=np.float32).tobytes()),
    ]
    kept = [(n, i.dtype, tuple(i.shape), read_tensor(i).tobytes()) for n, i in header.tensors.items()]
    write_file(shard, kept + extra, metadata=header.metadata or None)
    index["weight_map"].update({name: shard.name for name in HC_HEAD})
    index_path.write_text(json.dumps(index))
    segments = {s.name: s for s in plan_rank(open_pack(pack_dir), 1, 0).segments}
    assert all(segments[name].dtype == "float32" and segments[name].block == "top" for name in HC_HEAD)
