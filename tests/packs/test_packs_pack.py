"""open_pack on the tiny pack and on damaged copies of it: groups, natives, coverage, shards, typed errors."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from tfc.fixtures.safetensors_writer import write_file
from tfc.packs.errors import CoverageError, HeaderError, MissingTensor, PackError
from tfc.packs.exl3_groups import MCG_MARKER, MUL1_MARKER
from tfc.packs.pack import open_pack, read_tensor
from tfc.packs.safetensors_header import read_header
from tfc.packs.shards import INDEX_NAME


def clone(src: Path, dst: Path) -> Path:
    """A copy of a pack whose files are hard links; edit() replaces a file instead of writing through a link."""
    shutil.copytree(src, dst, copy_function=_link_shards)
    return dst


def _link_shards(src: str, dst: str) -> None:
    """Shards are linked (big, and only ever replaced); small files are copied."""
    if src.endswith(".safetensors"):
        os.link(src, dst)
    else:
        shutil.copy2(src, dst)


def shard_of(pack: Path, name: str) -> Path:
    return pack / json.loads((pack / INDEX_NAME).read_text())["weight_map"][name]


def load(path: Path) -> list[list]:
    """[name, dtype, shape, payload] of every tensor, in storage order."""
    h = read_header(path)
    data = path.read_bytes()
    order = sorted(range(len(h.names)), key=lambda i: h.offsets[i])
    return [
        [h.names[i], h.dtypes[i], h.shapes[i], data[h.offsets[i] : h.offsets[i] + h.nbytes[i]]] for i in order
    ]


def save(path: Path, tensors: list[list], reindex: bool = True) -> None:
    path.unlink()
    write_file(path, [tuple(t) for t in tensors], metadata={"format": "pt"})
    if reindex:
        weight_map = {
            n: p.name for p in sorted(path.parent.glob("*.safetensors")) for n in read_header(p).names
        }
        replace(path.parent / INDEX_NAME, json.dumps({"metadata": {}, "weight_map": weight_map}))


def replace(path: Path, text: str) -> None:
    """Write a new file in place of a (possibly hard-linked) one."""
    path.unlink()
    path.write_text(text)


def edit(pack: Path, name: str, change) -> None:
    """Apply change(tensors) to the shard holding `name` and rewrite the index from the headers."""
    path = shard_of(pack, name)
    tensors = load(path)
    save(path, change(tensors) or tensors)


def find(tensors: list[list], name: str) -> list:
    return next(t for t in tensors if t[0] == name)


@pytest.fixture
def damaged(tiny_pack, tmp_path):
    return clone(tiny_pack, tmp_path / "pack")


def test_tiny_opens_with_every_group_and_native(tiny_pack):
    pack = open_pack(tiny_pack)
    cfg = pack.config
    assert cfg.num_blocks == 11 and pack.tokenizer_path.name == "tokenizer.json"
    assert len(pack.shards) == 7
    g = pack.groups["layers.2.ffn.experts.1.w1"]
    assert (g.k, g.n, g.width, g.bits, g.codebook, g.tile_bytes) == (256, 640, 40, 2.5, "mul1", 80)
    assert g.trellis.shape == (16, 40, 40) and g.suh.shape == (256,) and g.svh.shape == (640,)
    assert g.marker is not None and g.kind == "ffn.experts.w1" and g.block == 2
    assert (
        pack.groups["layers.0.attn.wq_a"].codebook == "3inst"
        and pack.groups["layers.0.attn.wq_a"].marker is None
    )
    assert pack.groups["layers.1.attn.wq_a"].codebook == "mcg"
    assert pack.groups["head"].bits == 6 and pack.groups["mtp.2.main_proj"].k == 3 * 256
    assert "layers.4.attn.compressor.wgate" not in pack.groups  # ratio 1: no gate
    assert "layers.2.attn.compressor.wgate" in pack.groups
    assert "layers.6.attn.indexer.wq_b" in pack.groups and "layers.6.attn.indexer.wk" not in pack.groups
    assert pack.natives["layers.1.engram.q_weight"].shape == (4, 256)
    assert pack.natives["layers.1.engram.embed.weight"].dtype == "F8_E4M3"
    assert pack.dspark["main_proj"] == "mtp.2.main_proj"
    assert pack.ignored == ["layers.0.ffn.gate.bias_vl", "vision.patch_embed.weight"]
    assert len(pack.tensors) == len(pack.table.names)
    counted = (
        sum(3 + (g.marker is not None) for g in pack.groups.values()) + len(pack.natives) + len(pack.ignored)
    )
    assert counted == len(pack.tensors), "every stored tensor is a group member, a native or ignored"


def test_read_tensor_returns_the_payload(tiny_pack):
    pack = open_pack(tiny_pack)
    info = pack.natives["layers.0.attn_norm.weight"]
    arr = read_tensor(info)
    assert arr.dtype == np.float32 and arr.shape == info.shape and np.all(arr != 0)
    bf = pack.natives["layers.0.ffn_norm.weight"]
    raw, wide = read_tensor(bf), read_tensor(bf, as_float=True)
    assert raw.dtype == np.uint16 and wide.dtype == np.float32
    assert np.array_equal((raw.astype(np.uint32) << 16).view(np.float32), wide) and abs(wide.mean() - 1) < 0.1
    trellis = read_tensor(pack.groups["layers.3.ffn.experts.0.w2"].trellis)
    assert trellis.dtype == np.int16 and trellis.shape == (40, 16, 48) and trellis.std() > 1000


def test_missing_suh_is_named(damaged):
    edit(damaged, "layers.3.attn.wkv.suh", lambda ts: [t for t in ts if t[0] != "layers.3.attn.wkv.suh"])
    with pytest.raises(MissingTensor, match=r"layers\.3\.attn\.wkv\.suh"):
        open_pack(damaged)


def test_legacy_su_replaces_a_missing_suh(damaged):
    def swap(ts):
        t = find(ts, "layers.3.attn.wkv.suh")
        t[0], t[1], t[2], t[3] = "layers.3.attn.wkv.su", "I16", (16,), os.urandom(32)

    edit(damaged, "layers.3.attn.wkv.suh", swap)
    g = open_pack(damaged).groups["layers.3.attn.wkv"]
    assert g.suh is None and g.su.shape == (16,)


def test_trellis_inconsistent_with_suh(damaged):
    def grow(ts):
        t = find(ts, "layers.5.attn.wq_a.suh")
        t[2], t[3] = (384,), t[3] + t[3][:256]

    edit(damaged, "layers.5.attn.wq_a.suh", grow)
    with pytest.raises(HeaderError, match=r"layers\.5\.attn\.wq_a\.suh.*does not match the trellis"):
        open_pack(damaged)


def test_trellis_shape_not_the_models(damaged):
    def reshape(ts):
        t = find(ts, "layers.0.ffn.experts.3.w1.trellis")
        t[2] = (t[2][1], t[2][0], t[2][2])

    edit(damaged, "layers.0.ffn.experts.3.w1.trellis", reshape)
    with pytest.raises(HeaderError, match=r"experts\.3\.w1\.trellis.*expected I16 \[16, 40, width\]"):
        open_pack(damaged)


def test_unknown_codebook_marker_value(damaged):
    edit(
        damaged,
        "layers.2.attn.wkv.mul1",
        lambda ts: find(ts, "layers.2.attn.wkv.mul1").__setitem__(3, b"\x01\x02\x03\x04"),
    )
    with pytest.raises(HeaderError, match=r"unknown codebook marker value 0x04030201"):
        open_pack(damaged)
    assert open_pack(damaged, check_markers=False).groups["layers.2.attn.wkv"].codebook == "mul1"


def test_empty_marker_marks_presence(damaged):
    def empty(ts):
        t = find(ts, "layers.1.attn.wkv.mcg")
        t[2], t[3] = (0,), b""

    edit(damaged, "layers.1.attn.wkv.mcg", empty)
    assert open_pack(damaged).groups["layers.1.attn.wkv"].codebook == "mcg"


def test_both_markers_refused(damaged):
    edit(
        damaged,
        "layers.1.attn.wkv.mcg",
        lambda ts: ts.append(["layers.1.attn.wkv.mul1", "I32", (), MUL1_MARKER.to_bytes(4, "little")]),
    )
    with pytest.raises(HeaderError, match=r"both \.mcg and \.mul1"):
        open_pack(damaged)


def test_half_rate_without_mul1_refused(damaged):
    def half(ts):  # layer 0 is 3inst: a 2.5-bit trellis there is not a width exllamav3 can write
        t = find(ts, "layers.0.ffn.experts.2.w2.trellis")
        t[2], t[3] = (40, 16, 40), os.urandom(40 * 16 * 40 * 2)

    edit(damaged, "layers.0.ffn.experts.2.w2.trellis", half)
    with pytest.raises(HeaderError, match="needs the mul1 codebook"):
        open_pack(damaged)


def test_marker_payload_holds_the_codebook_constant(tiny_pack):
    pack = open_pack(tiny_pack)
    mcg = read_tensor(pack.groups["layers.1.attn.wkv"].marker)
    mul1 = read_tensor(pack.groups["layers.2.attn.wkv"].marker)
    assert (
        mcg.shape == ()
        and int(mcg.view(np.uint32)) == MCG_MARKER
        and int(mul1.view(np.uint32)) == MUL1_MARKER
    )


def test_unplanned_tensor_is_a_coverage_error(damaged):
    edit(
        damaged,
        "layers.3.attn.wkv.suh",
        lambda ts: ts.append(["layers.3.attn.compressor.ape", "F32", (2, 4), bytes(32)]),
    )
    with pytest.raises(CoverageError, match=r"1 stored tensor\(s\) .*layers\.3\.attn\.compressor\.ape"):
        open_pack(damaged)


def test_hf_round_trip_names_are_refused(damaged):
    def rename(ts):
        for t in ts:
            t[0] = "model." + t[0]

    edit(damaged, "layers.0.attn_norm.weight", rename)
    with pytest.raises(
        CoverageError, match=r"model\.layers\.0\..*and \d+ more; \d+ expected tensor\(s\) are missing"
    ):
        open_pack(damaged)


def test_missing_native_names_block(damaged):
    edit(
        damaged,
        "layers.4.attn.kv_norm.weight",
        lambda ts: [t for t in ts if t[0] != "layers.4.attn.kv_norm.weight"],
    )
    with pytest.raises(
        MissingTensor, match=r"layers\.4\.attn\.kv_norm\.weight is missing \(block layers\.4\)"
    ):
        open_pack(damaged)


def test_wrong_native_shape(damaged):
    edit(
        damaged,
        "layers.4.ffn.gate.bias",
        lambda ts: find(ts, "layers.4.ffn.gate.bias").__setitem__(2, (2, 4)),
    )
    with pytest.raises(HeaderError, match=r"layers\.4\.ffn\.gate\.bias: F32 \[2, 4\], expected \[8\]"):
        open_pack(damaged)


def test_missing_shard_is_named(damaged):
    (damaged / "model-00003-of-00005.safetensors").unlink()
    with pytest.raises(MissingTensor, match=r"missing: model-00003-of-00005\.safetensors"):
        open_pack(damaged)


def test_index_listing_a_tensor_its_shard_lacks(damaged):
    index = json.loads((damaged / INDEX_NAME).read_text())
    index["weight_map"]["layers.9.attn.wq_a.trellis"] = "model-00002-of-00005.safetensors"
    replace(damaged / INDEX_NAME, json.dumps(index))
    with pytest.raises(MissingTensor, match=r"layers\.9\.attn\.wq_a\.trellis"):
        open_pack(damaged)


def test_index_naming_the_wrong_shard(damaged):
    index = json.loads((damaged / INDEX_NAME).read_text())
    index["weight_map"]["layers.0.attn.wq_a.trellis"] = "model-00003-of-00005.safetensors"
    replace(damaged / INDEX_NAME, json.dumps(index, indent=2))
    with pytest.raises(MissingTensor, match=r"lists layers\.0\.attn\.wq_a\.trellis for model-00003"):
        open_pack(damaged)


def test_index_in_any_order_and_format(damaged):
    index = json.loads((damaged / INDEX_NAME).read_text())
    items = sorted(index["weight_map"].items(), reverse=True)
    replace(
        damaged / INDEX_NAME, json.dumps({"metadata": {"total_size": 1}, "weight_map": dict(items)}, indent=2)
    )
    assert len(open_pack(damaged).groups) == 361


def test_tensor_stored_twice_is_refused(damaged):
    edit(
        damaged,
        "layers.0.attn_norm.weight",
        lambda ts: ts.append(list(find(load(shard_of(damaged, "norm.weight")), "norm.weight"))),
    )
    with pytest.raises(HeaderError, match=r"tensor norm\.weight is stored twice"):
        open_pack(damaged)


def test_without_index_every_shard_by_name(damaged):
    (damaged / INDEX_NAME).unlink()
    pack = open_pack(damaged)
    assert [p.name for p in pack.shards] == sorted(p.name for p in damaged.glob("*.safetensors"))
    assert pack.index is None and len(pack.groups) == 361


def test_ignore_list_and_superseded_dspark_copies(damaged):
    def extra(ts):
        ts.append(
            ["layers.3.attn.wkv.weight", "BF16", (128, 256), bytes(128 * 256 * 2)]
        )  # bf16 twin of a group
        ts.append(["aligner.proj.weight", "F16", (2,), bytes(4)])

    edit(damaged, "layers.3.attn.wkv.trellis", extra)
    edit(
        damaged,
        "mtp.0.attn_norm.weight",
        lambda ts: ts.append(["mtp.0.main_norm.weight", "F32", (256,), bytes(1024)]),
    )
    pack = open_pack(damaged)
    assert {"layers.3.attn.wkv.weight", "aligner.proj.weight", "mtp.0.main_norm.weight"} <= set(pack.ignored)
    assert pack.dspark["main_norm.weight"] == "mtp.2.main_norm.weight"


def test_not_a_pack(tmp_path):
    with pytest.raises(PackError, match=r"no config\.json"):
        open_pack(tmp_path)
    with pytest.raises(PackError, match="not a directory"):
        open_pack(tmp_path / "nothing")


def test_config_asking_for_more_than_the_pack_holds(damaged):
    raw = json.loads((damaged / "config.json").read_text())
    raw["text_config"]["n_routed_experts"] = 9000
    replace(damaged / "config.json", json.dumps(raw))
    with pytest.raises(MissingTensor, match="needs at least"):
        open_pack(damaged)
