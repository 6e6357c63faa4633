"""Rank plans: byte counts against an independent computation, TP parts reassembling to TP=1, tables."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from click.testing import CliRunner
from tfc.cache.reader import open_rank
from tfc.compiler.prepare import prepare
from tfc.packs.engram_layout import layout_from_config
from tfc.packs.pack import open_pack, read_tensor

from tfc.cli.plan_cmd import plan_report

KINDS = ("routed_trellis", "shared_trellis", "other_trellis", "scales", "natives", "tables", "engram_rows",
         "engram_assets", "tokenizer")  # fmt: skip
F32 = re.compile(
    r"(norm\.weight|hc_\w+|attn_sink|gate\.bias|weights_proj\.weight|confidence_head\.proj\.weight)$"
)
BF16 = re.compile(r"(ffn\.gate\.weight|^embed\.weight|markov_head\.(embed|head)\.weight)$")
ITEM = {"F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "U8": 1, "F8_E4M3": 1, "F8_E8M0": 1}


def _share(extent: int, world: int, rank: int) -> tuple[int, int]:
    """Values [start, stop) of a rank: 128-blocks dealt out, lower ranks one more (written afresh here)."""
    blocks = extent // 128
    sizes = [blocks // world + (1 if r < blocks % world else 0) for r in range(world)]
    start = sum(sizes[:rank]) * 128
    return start, start + sizes[rank] * 128


def _expected(pack, world: int, rank: int) -> dict[str, dict[str, int]]:
    """Bytes by block and kind, from the stored tensors and the split rules of the spec alone."""
    cfg = pack.config
    blocks = [f"layers.{b}" for b in range(cfg.num_hidden_layers)] + [
        f"mtp.{i}" for i in range(cfg.num_nextn_predict_layers)
    ]
    out = {b: dict.fromkeys(KINDS, 0) for b in [*blocks, "top"]}

    def block_of(name: str) -> str:
        m = re.match(r"^(layers\.\d+|mtp\.\d+)\.", name)
        return m.group(1) if m else "top"

    per_group = cfg.o_groups // world
    entries: dict[tuple[str, str], int] = {}
    for name, info in pack.tensors.items():
        if not name.endswith(".trellis"):
            continue
        base = name[: -len(".trellis")]
        tk, tn, w = info.shape
        k, n = tk * 16, tn * 16
        m = re.search(r"\.attn\.wo_a\.slice\.(\d+)$", base)
        if m and not rank * per_group <= int(m.group(1)) < (rank + 1) * per_group:
            continue
        if base == "head" or re.search(r"\.(attn\.wq_b|ffn\.(shared_)?experts(\.\d+)?\.w[13])$", base):
            n = _share(n, world, rank)[1] - _share(n, world, rank)[0]
        elif re.search(r"\.(attn\.wo_b|ffn\.(shared_)?experts(\.\d+)?\.w2)$", base):
            k = _share(k, world, rank)[1] - _share(k, world, rank)[0]
        block = block_of(base)
        kind = (
            "routed_trellis"
            if ".ffn.experts." in base
            else "shared_trellis"
            if ".shared_experts." in base
            else "other_trellis"
        )
        out[block][kind] += k * n // 256 * 2 * w
        out[block]["scales"] += 2 * (k + n)
        m = re.search(r"\.ffn\.(?:experts\.\d+|shared_experts)\.(w[123])$", base)
        if m:
            entries[(block, m.group(1))] = entries.get((block, m.group(1)), 0) + 1
    for (block, _), count in entries.items():
        out[block]["tables"] += count * (8 + 4 + 4)
    for name, info in pack.natives.items():
        if ".engram.embed." in name or name.endswith("engram.k_weight"):
            continue
        count = int(np.prod(info.shape))
        if name == "embed.weight":
            a, b = _share(cfg.vocab_size, world, rank)
            count = (b - a) * info.shape[1]
        if name.endswith("attn_sink"):
            count //= world
        size = (
            4
            if F32.search(name) or name.endswith("engram.q_weight")
            else 2
            if BF16.search(name)
            else ITEM[info.dtype]
        )
        out[block_of(name)]["natives"] += count * size
    if cfg.engram_layer_ids:
        layout = layout_from_config(cfg)
        cols, layers = layout.n_cols, layout.n_layers
        part = -(-cols // world)
        lo_col, hi_col = min(rank * part, cols), min((rank + 1) * part, cols)
        row_bytes = cfg.engram_head_dim + cfg.engram_head_dim // 32
        for i, layer in enumerate(cfg.engram_layer_ids):
            primes = layout.primes[i]
            out[f"layers.{layer}"]["engram_rows"] += sum(primes[lo_col:hi_col]) * row_bytes
        out["top"]["engram_assets"] = 8 * (2 * layers * cols + layers * cfg.engram_max_ngram_size + 8 + layers
                                           + 2 * world + 2 * layers) + 4 * cfg.vocab_size  # fmt: skip
    out["top"]["tokenizer"] = (pack.root / "tokenizer.json").stat().st_size
    return out


@pytest.mark.parametrize("world", [1, 2, 4])
def test_plan_bytes_match_independent_computation(tiny_pack, world):
    pack = open_pack(tiny_pack)
    report = plan_report(pack, world)
    assert report["world"] == world
    for rank_report in report["ranks"]:
        expected = _expected(pack, world, rank_report["rank"])
        got = {layer["block"]: layer["bytes"] for layer in rank_report["layers"]} | {
            "top": rank_report["top"]
        }
        for block, kinds in expected.items():
            assert {k: got[block][k] for k in KINDS} == kinds, (world, rank_report["rank"], block)
        assert rank_report["total"] == sum(sum(k.values()) for k in expected.values())


def test_plan_cli_json_shape_and_bad_world(tiny_pack):
    from tfc.cli import cli

    result = CliRunner().invoke(cli, ["plan", str(tiny_pack), "--tp", "2", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    layer = data["ranks"][0]["layers"][0]
    assert set(layer) >= {"layer", "block", "bytes"} and set(KINDS) <= set(layer["bytes"])
    assert data["ranks"][0]["layers"][-1]["block"].startswith("mtp.")


@pytest.fixture(scope="module")
def images(tiny_pack, tmp_path_factory):
    """The tiny pack prepared at TP 1, 2 and 4, each rank opened."""
    root = tmp_path_factory.mktemp("images")
    pack = open_pack(tiny_pack)
    out = {}
    for world in (1, 2, 4):
        result = prepare(pack, root, world, jobs=4)
        out[world] = [open_rank(result.path / f"rank{r}") for r in range(world)]
    return out


def _array(image, name):
    entry = image.manifest.segment_map[name]
    dtype = {"bfloat16": np.uint16}.get(entry.dtype, entry.dtype)
    return np.frombuffer(image.segment(name), dtype=dtype).reshape(entry.shape)


def _entries(image, base):
    """Per-entry trellis arrays [tk, tn, W] of an expert table, stack or ragged."""
    entry = image.manifest.segment_map[f"{base}.trellis"]
    offsets, widths = _array(image, f"{base}.offsets"), _array(image, f"{base}.widths")
    k, n = _array(image, f"{base}.suh").shape[1], _array(image, f"{base}.svh").shape[1]
    raw = np.frombuffer(image.segment(f"{base}.trellis"), np.uint8)
    out = []
    for off, w in zip(offsets, widths, strict=True):
        size = (k // 16) * (n // 16) * 2 * int(w)
        out.append(raw[off : off + size].view(np.int16).reshape(k // 16, n // 16, int(w)))
    assert entry.layout in ("exl3.experts.stack.v1", "exl3.experts.ragged.v1")
    return out


@pytest.mark.parametrize("world", [2, 4])
def test_split_parts_reassemble_to_tp1(images, world):
    whole = images[1][0]
    ranks = images[world]
    names = whole.manifest.segment_map
    checked = 0
    for name in names:
        parts = [r for r in ranks if name in r.manifest.segment_map]
        if name.startswith("engram.") or name.endswith((".offsets", ".widths", ".codebooks")):
            continue
        ref = _array(whole, name)
        if ".ffn.experts." in name and name.endswith(".trellis"):
            base = name[: -len(".trellis")]
            axis = 0 if base.endswith("w2") else 1
            pieces = [_entries(r, base) for r in ranks]
            for e, ref_entry in enumerate(_entries(whole, base)):
                assert np.array_equal(np.concatenate([p[e] for p in pieces], axis=axis), ref_entry), (name, e)
            checked += 1
            continue
        arrays = [_array(r, name) for r in parts]
        if len(parts) == 1 and ".wo_a." in name:
            assert np.array_equal(arrays[0], ref)
            continue
        if all(a.shape == ref.shape for a in arrays):
            assert all(np.array_equal(a, ref) for a in arrays), name
            continue
        axis = next(i for i in range(ref.ndim) if arrays[0].shape[i] != ref.shape[i])
        assert np.array_equal(np.concatenate(arrays, axis=axis), ref), name
        checked += 1
    assert checked > 20
    wo_a = [n for n in names if ".attn.wo_a." in n and n.endswith(".trellis")]
    held = [n for r in ranks for n in r.manifest.segment_map if ".attn.wo_a." in n and n.endswith(".trellis")]
    assert sorted(held) == sorted(wo_a)


def test_expert_tables_equal_pack_tensors(tiny_pack, images):
    pack = open_pack(tiny_pack)
    image = images[1][0]
    tables = [
        n[: -len(".trellis")]
        for n in image.manifest.segment_map
        if re.search(r"experts\.w[123]\.trellis$", n)
    ]
    assert tables
    for base in tables:
        block, proj = base.split(".ffn.experts.")
        entries = _entries(image, base)
        suh, svh = _array(image, f"{base}.suh"), _array(image, f"{base}.svh")
        names = [f"{block}.ffn.experts.{e}.{proj}" for e in range(len(entries) - 1)] + [
            f"{block}.ffn.shared_experts.{proj}"
        ]
        for i, name in enumerate(names):
            group = pack.groups[name]
            assert np.array_equal(entries[i], read_tensor(group.trellis)), name
            assert np.array_equal(suh[i], read_tensor(group.suh)) and np.array_equal(
                svh[i], read_tensor(group.svh)
            )
        codebooks = _array(image, f"{base}.codebooks")
        assert [int(c) for c in codebooks] == [
            {"3inst": 0, "mcg": 1, "mul1": 2}[pack.groups[n].codebook] for n in names
        ]
