"""Every segment a DeepSeek-V4.1 rank image holds, with the dtype and shape its manifest must give it (stdlib only).

Stated from the model config and plan the manifest records (the part of a split dimension a rank holds, each
EXL3 group's bits), never from the segment records themselves: a manifest that retypes or reshapes a segment
is refused even when it was re-signed and its digests agree. A dimension stated as None is one the bytes of
another segment decide (a mixed-width expert table's length, a rank's Engram rows, the tokenizer's size).
Segments split by plan attrs (EXL3 groups, expert tables, the embedding) are stated only where the plan
records their attrs, so a manifest that drops the attrs leaves them unknown, and refused.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from tfc.packs.deepseek_v41_config import DeepseekV41Config, config_from_dict
from tfc.packs.deepseek_v41_contract import (
    ENGRAM_PARAMS,
    SEG_LAYER_IDS,
    SEG_MULTIPLIERS,
    SEG_OFFSETS,
    SEG_PARAMS,
    SEG_PRIMES,
    SEG_ROW_RANGES,
    SEG_SHARDS,
    SEG_TOKEN_MAP,
    engram_rows_name,
)
from tfc.packs.deepseek_v41_names import NativeSpec, expected_tensors
from tfc.packs.errors import ConfigError

Shape = tuple[int | None, ...]
# (dtype, or None where the pack's stored one is kept; the shapes the segment may have)
Spec = tuple[str | None, tuple[Shape, ...]]

TILE = 16  # EXL3 tiles are 16 x 16 values
PROJECTIONS = ("w1", "w3", "w2")

# Natives held in float32 (norms, mHC, sinks, selection bias, indexer weights) or bfloat16, by name.
F32_NATIVE = re.compile(
    r"(norm\.weight|(^|\.)hc_[a-z_]+|attn_sink|gate\.bias|weights_proj\.weight|confidence_head\.proj\.weight)$"
)
BF16_NATIVE = re.compile(r"(ffn\.gate\.weight|^embed\.weight|markov_head\.(embed|head)\.weight)$")
_WO_A = re.compile(r"\.attn\.wo_a\.slice\.(\d+)$")


class SegmentSpecError(ConfigError):
    """A manifest whose config or plan cannot state what its segments must be."""


def native_dtype(name: str) -> str | None:
    """The dtype a native is held in, by its name (None: as the pack stores it)."""
    if F32_NATIVE.search(name):
        return "float32"
    if BF16_NATIVE.search(name):
        return "bfloat16"
    return None


def group_split(name: str) -> str:
    """How an EXL3 group (not a routed or shared expert) is split across ranks: column, row or whole."""
    if name == "head" or name.endswith(".attn.wq_b"):
        return "column"
    if name.endswith(".attn.wo_b"):
        return "row"
    return "whole"


def wo_a_groups(config: DeepseekV41Config, world: int, rank: int) -> range:
    """The wo_a groups (o_groups) a rank holds whole."""
    per = config.o_groups // world
    return range(rank * per, (rank + 1) * per)


def expected_segments(
    config: Any, world: int, rank: int, attrs: Mapping[str, Any], names: Collection[str]
) -> dict[str, Spec]:
    """{segment name: (dtype, shapes)} of one rank of a world (`names`: the segments the image holds, which
    resolve DSpark holders and optional tensors; `attrs`: the plan's per-segment attrs)."""
    c = config_from_dict(config, "meta.pack_config")
    want = expected_tensors(c, names)
    out: dict[str, Spec] = {}
    for group in want.groups:
        if group.kind.startswith(("ffn.experts.", "ffn.shared_experts.")):
            continue
        for name in group.names:
            slot = _WO_A.search(name)
            if slot is None or int(slot.group(1)) in wo_a_groups(c, world, rank):
                _group(out, name, group.k, group.n, attrs)
    for block in range(c.num_blocks):
        for proj in PROJECTIONS:
            _table(out, c, block, proj, attrs)
    for native in want.natives:
        _native(out, c, native, world, attrs)
    if c.engram_layer_ids:
        _engram(out, c, world)
    out["tokenizer.json"] = ("uint8", ((None,),))
    return out


def _group(out: dict[str, Spec], name: str, k: int, n: int, attrs: Mapping[str, Any]) -> None:
    """A split EXL3 group's trellis tiles, its scale vectors and its optional bias (none without plan attrs)."""
    if f"{name}.trellis" not in attrs:
        return
    a = _attrs(attrs, f"{name}.trellis")
    split = group_split(name)
    if split == "column":
        n = _part(a, n, f"{name}.trellis")
    elif split == "row":
        k = _part(a, k, f"{name}.trellis")
    width = _width(a, f"{name}.trellis")
    out[f"{name}.trellis"] = ("int16", ((k // TILE, n // TILE, width),))
    out[f"{name}.suh"] = ("float16", ((k,),))
    out[f"{name}.svh"] = ("float16", ((n,),))
    out[f"{name}.bias"] = ("float16", ((n,),))


def _table(
    out: dict[str, Spec], c: DeepseekV41Config, block: int, proj: str, attrs: Mapping[str, Any]
) -> None:
    """One projection's expert table: the routed entries, then the shared expert's."""
    base = f"{c.block_prefix(block)}.ffn.experts.{proj}"
    if f"{base}.trellis" not in attrs:
        return
    a = _attrs(attrs, f"{base}.trellis")
    entries = c.num_experts(block) + (1 if c.n_shared_experts else 0)
    part = _part(a, c.moe_intermediate_size, f"{base}.trellis")  # w1, w3 split by column, w2 by row
    k, n = (part, c.hidden_size) if proj == "w2" else (c.hidden_size, part)
    widths = a.get("widths")
    if not isinstance(widths, list) or not widths or not all(_whole(w) for w in widths):
        raise SegmentSpecError(f"plan attrs of {base}.trellis: widths must be a list of whole numbers")
    if len(widths) == 1:
        out[f"{base}.trellis"] = ("int16", ((entries, k // TILE, n // TILE, widths[0]),))
    else:
        out[f"{base}.trellis"] = ("uint8", ((None,),))
    out[f"{base}.offsets"] = ("int64", ((entries,),))
    out[f"{base}.widths"] = ("int32", ((entries,),))
    out[f"{base}.codebooks"] = ("int32", ((entries,),))
    out[f"{base}.suh"] = ("float16", ((entries, k),))
    out[f"{base}.svh"] = ("float16", ((entries, n),))


def _native(out: dict[str, Spec], c: DeepseekV41Config, native: NativeSpec, world: int,
            attrs: Mapping[str, Any]) -> None:  # fmt: skip
    """A native tensor as the rank holds it (Engram tables go to row segments, q and k to their product)."""
    name = native.name
    if native.kind == "engram.table" or name.endswith(".engram.k_weight"):
        return
    if name.endswith(".engram.q_weight"):
        out[name.removesuffix(".q_weight") + ".qk"] = ("float32", native.shapes)
        return
    shapes: tuple[Shape, ...] = native.shapes
    if name == "embed.weight":  # the vocabulary rows the head's column split gave this rank
        if "head.trellis" not in attrs:
            return
        shapes = ((_part(_attrs(attrs, "head.trellis"), c.vocab_size, "head.trellis"), c.hidden_size),)
    elif name.endswith(".attn.attn_sink"):
        shapes = ((c.num_attention_heads // world,),)
    out[name] = (native_dtype(name), shapes)


def _engram(out: dict[str, Spec], c: DeepseekV41Config, world: int) -> None:
    """Engram's host-side hash assets and each layer's rows of its table."""
    layers, cols, hd = len(c.engram_layer_ids), c.engram_columns, c.engram_head_dim
    out[SEG_TOKEN_MAP] = ("int32", ((c.vocab_size,),))
    out[SEG_MULTIPLIERS] = ("int64", ((layers, c.engram_max_ngram_size),))
    out[SEG_PRIMES] = ("int64", ((layers, cols),))
    out[SEG_OFFSETS] = ("int64", ((layers, cols),))
    out[SEG_PARAMS] = ("int64", ((len(ENGRAM_PARAMS),),))
    out[SEG_LAYER_IDS] = ("int64", ((layers,),))
    out[SEG_SHARDS] = ("int64", ((world, 2),))
    out[SEG_ROW_RANGES] = ("int64", ((layers, 2),))
    for layer in c.engram_layer_ids:  # per row: head_dim e4m3 bytes, then head_dim / 32 e8m0 bytes
        out[engram_rows_name(layer)] = ("uint8", ((None, hd + hd // 32),))


def _attrs(attrs: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    a = attrs.get(name)
    if not isinstance(a, Mapping):
        raise SegmentSpecError(f"the plan records no attrs for segment {name}")
    return a


def _part(a: Mapping[str, Any], extent: int, name: str) -> int:
    """The size of the rank's part [start, stop) of a split dimension of `extent` values."""
    part = a.get("part")
    if not (isinstance(part, list) and len(part) == 2 and all(_whole(v) for v in part)
            and 0 <= part[0] < part[1] <= extent):  # fmt: skip
        raise SegmentSpecError(f"plan attrs of {name}: part {part!r:.40} is not a range within [0, {extent}]")
    return part[1] - part[0]


def _width(a: Mapping[str, Any], name: str) -> int:
    """int16 values per 16 x 16 tile of a group of `bits` bits per weight."""
    bits = a.get("bits")
    if isinstance(bits, bool) or not isinstance(bits, int | float) or not 1 <= bits <= 8 or bits * TILE % 1:
        raise SegmentSpecError(f"plan attrs of {name}: bits {bits!r:.20} is not 1-8 in sixteenths")
    return int(bits * TILE)


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)
