"""DeepSeek-V4.1 tensor names: per block the EXL3 groups (k, n) and natives (shapes) a pack must hold."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass

from tfc.packs.deepseek_v41_config import DeepseekV41Config
from tfc.packs.errors import ConfigError

FLOAT = frozenset(("F32", "BF16", "F16"))
F32 = frozenset(("F32",))
IGNORED_PREFIXES = ("vision.", "aligner.", "image_")
IGNORED_SUFFIXES = (".ffn.gate.bias_vl",)
# DSpark tensors live in "the latest mtp.i holding the suffix" (spec section 3.2).
DSPARK_GROUPS = ("main_proj",)


@dataclass(frozen=True)
class GroupKind:
    """EXL3 groups of one projection kind in one block: full base names, all k x n (input x output)."""

    block: int | None  # None: model level
    kind: str  # e.g. "attn.wq_a", "ffn.experts.w1", "head"
    k: int
    n: int
    names: tuple[str, ...]


@dataclass(frozen=True)
class NativeSpec:
    """One native (non-EXL3) tensor: its full name, allowed shapes and stored dtypes."""

    name: str
    block: int | None
    kind: str
    shapes: tuple[tuple[int, ...], ...]
    dtypes: frozenset[str]
    optional: bool = False


@dataclass(frozen=True)
class Expected:
    """Everything a pack of this config must (or may) hold, with DSpark names resolved."""

    groups: tuple[GroupKind, ...]
    natives: tuple[NativeSpec, ...]
    superseded: tuple[str, ...]  # earlier DSpark copies of a suffix a later mtp block also holds
    dspark: dict[str, str]  # DSpark suffix -> the stored name in use


def is_ignored(name: str) -> bool:
    """Names on the spec's ignore list (vision tower, image bias); EXL3 .weight twins are handled apart."""
    return name.startswith(IGNORED_PREFIXES) or name.endswith(IGNORED_SUFFIXES)


def block_groups(c: DeepseekV41Config, block: int) -> list[GroupKind]:
    """The EXL3 groups of one block, one entry per projection kind."""
    p, mode = c.block_prefix(block), c.layer_mode(block)
    D, hd, ql = c.hidden_size, c.head_dim, c.q_lora_rank
    heads_per_group = c.num_attention_heads // c.o_groups
    out: list[tuple[str, int, int, list[str]]] = [
        ("attn.wq_a", D, ql, [f"{p}.attn.wq_a"]),
        ("attn.wkv", D, hd, [f"{p}.attn.wkv"]),
        ("attn.wq_b", ql, c.num_attention_heads * hd, [f"{p}.attn.wq_b"]),
        (
            "attn.wo_a",
            heads_per_group * hd,
            c.o_lora_rank,
            [f"{p}.attn.wo_a.slice.{g}" for g in range(c.o_groups)],
        ),
        ("attn.wo_b", c.o_groups * c.o_lora_rank, D, [f"{p}.attn.wo_b"]),
    ]
    if mode.mode == "full":
        out.append(("attn.compressor.wkv", D, hd, [f"{p}.attn.compressor.wkv"]))
        if mode.compress_ratio == 2:
            out.append(("attn.compressor.wgate", D, hd, [f"{p}.attn.compressor.wgate"]))
        out.append(("attn.indexer.wk", hd, c.index_head_dim, [f"{p}.attn.indexer.wk"]))
    if mode.mode in ("full", "reindex"):
        out.append(("attn.indexer.wq_b", ql, c.index_n_heads * c.index_head_dim, [f"{p}.attn.indexer.wq_b"]))
    if mode.engram:
        k = c.engram_columns * c.engram_head_dim
        out.append(("engram.wkv", k, (c.hc_mult + 1) * D, [f"{p}.engram.wkv"]))
    sw, w = c.shared_expert_width, c.moe_intermediate_size
    out += [
        ("ffn.shared_experts.w1", D, sw, [f"{p}.ffn.shared_experts.w1"]),
        ("ffn.shared_experts.w2", sw, D, [f"{p}.ffn.shared_experts.w2"]),
        ("ffn.shared_experts.w3", D, sw, [f"{p}.ffn.shared_experts.w3"]),
    ]
    experts = [f"{p}.ffn.experts.{e}." for e in range(c.num_experts(block))]
    out += [
        ("ffn.experts.w1", D, w, [e + "w1" for e in experts]),
        ("ffn.experts.w2", w, D, [e + "w2" for e in experts]),
        ("ffn.experts.w3", D, w, [e + "w3" for e in experts]),
    ]
    return [_kind(block, kind, k, n, names) for kind, k, n, names in out]


def block_natives(c: DeepseekV41Config, block: int) -> list[NativeSpec]:
    """The native tensors of one block."""
    p, mode = c.block_prefix(block), c.layer_mode(block)
    D, hc, E = c.hidden_size, c.hc_mult, c.num_experts(block)
    mix = (2 + hc) * hc
    out = [
        (f"{p}.attn_norm.weight", "norm", (D,), FLOAT),
        (f"{p}.ffn_norm.weight", "norm", (D,), FLOAT),
        (f"{p}.attn.q_norm.weight", "norm", (c.q_lora_rank,), FLOAT),
        (f"{p}.attn.kv_norm.weight", "norm", (c.head_dim,), FLOAT),
        (f"{p}.attn.attn_sink", "attn_sink", (c.num_attention_heads,), FLOAT),
        (f"{p}.ffn.gate.weight", "router", (E, D), FLOAT),
        (f"{p}.ffn.gate.bias", "router", (E,), FLOAT),
    ]
    for site in ("attn", "ffn"):
        out += [
            (f"{p}.hc_{site}_fn", "mhc", (mix, hc * D), FLOAT),
            (f"{p}.hc_{site}_base", "mhc", (mix,), FLOAT),
            (f"{p}.hc_{site}_scale", "mhc", (3,), FLOAT),
        ]
    if mode.mode == "full":
        out.append((f"{p}.attn.compressor.norm.weight", "norm", (c.head_dim,), FLOAT))
        out.append((f"{p}.attn.indexer.k_norm.weight", "norm", (c.index_head_dim,), FLOAT))
    if mode.mode in ("full", "reindex"):
        out.append((f"{p}.attn.indexer.weights_proj.weight", "indexer", (c.index_n_heads, D), FLOAT))
    if mode.engram:
        out.append((f"{p}.engram.q_weight", "engram", (hc, D), FLOAT))
        out.append((f"{p}.engram.k_weight", "engram", (hc, D), FLOAT))
    return [NativeSpec(name, block, kind, (shape,), dtypes) for name, kind, shape, dtypes in out]


def model_groups(c: DeepseekV41Config) -> list[GroupKind]:
    """Model-level EXL3 groups: the output head."""
    return [_kind(None, "head", c.hidden_size, c.vocab_size, ["head"])]


def model_natives(c: DeepseekV41Config) -> list[NativeSpec]:
    """Model-level natives, including the optional Engram tables (EXL3 packs do not carry them)."""
    D, hc = c.hidden_size, c.hc_mult
    out = [
        NativeSpec("embed.weight", None, "embed", ((c.vocab_size, D),), FLOAT),
        NativeSpec("norm.weight", None, "norm", ((D,),), FLOAT),
        # DeepSeek-V4 checkpoints carry an mHC head; V4.1's reference collapses the streams with the last
        # FFN site's `pre` and has none, so a V4.1 pack may or may not hold these (spec: check headers).
        NativeSpec("hc_head_fn", None, "mhc", ((hc, hc * D),), FLOAT, optional=True),
        NativeSpec("hc_head_base", None, "mhc", ((hc,),), FLOAT, optional=True),
        NativeSpec("hc_head_scale", None, "mhc", ((1,),), FLOAT, optional=True),
    ]
    for layer, rows in zip(c.engram_layer_ids, c.engram_num_embeddings, strict=True):
        hd = c.engram_head_dim
        out.append(NativeSpec(f"layers.{layer}.engram.embed.weight", layer, "engram.table", ((rows, hd),),
                              frozenset(("F8_E4M3",)), optional=True))  # fmt: skip
        out.append(NativeSpec(f"layers.{layer}.engram.embed.scale", layer, "engram.table", ((rows, hd // 32),),
                              frozenset(("F8_E8M0",)), optional=True))  # fmt: skip
    return out


def dspark_suffixes(
    c: DeepseekV41Config,
) -> tuple[list[tuple[str, int, int]], list[tuple[str, tuple, frozenset, bool]]]:
    """DSpark EXL3 groups (suffix, k, n) and natives (suffix, shapes, dtypes, optional)."""
    D, r, V = c.hidden_size, c.dspark_markov_rank, c.vocab_size
    groups = [("main_proj", len(c.dspark_target_layer_ids) * D, D)]
    natives = [
        ("main_norm.weight", ((D,),), FLOAT, False),
        ("norm.weight", ((D,),), FLOAT, False),
        ("markov_head.embed.weight", ((V, r),), FLOAT, False),
        ("markov_head.head.weight", ((V, r),), FLOAT, False),
        ("confidence_head.proj.weight", ((D + r,), (1, D + r)), FLOAT, True),
    ]
    return groups, natives


def expected_tensors(c: DeepseekV41Config, stored: Container[str]) -> Expected:
    """Every group and native the pack must hold; DSpark names resolved against the stored names."""
    groups = [g for b in range(c.num_blocks) for g in block_groups(c, b)] + model_groups(c)
    natives = [n for b in range(c.num_blocks) for n in block_natives(c, b)] + model_natives(c)
    superseded: list[str] = []
    dspark: dict[str, str] = {}
    mtp = [f"mtp.{i}." for i in range(c.num_nextn_predict_layers)]
    if mtp:
        dgroups, dnatives = dspark_suffixes(c)
        group_suffixes = (".trellis", ".suh", ".svh", ".su", ".sv", ".mcg", ".mul1", ".bias", ".weight")
        for suffix, k, n in dgroups:
            holders = [p + suffix for p in mtp if p + suffix + ".trellis" in stored]
            name = holders[-1] if holders else mtp[-1] + suffix
            dspark[suffix] = name
            superseded += [h + s for h in holders[:-1] for s in group_suffixes if h + s in stored]
            groups.append(_kind(c.num_blocks - len(mtp) + int(name.split(".")[1]), "main_proj", k, n, [name]))
        for suffix, shapes, dtypes, optional in dnatives:
            holders = [p + suffix for p in mtp if p + suffix in stored]
            name = holders[-1] if holders else mtp[-1] + suffix
            dspark[suffix] = name
            superseded += holders[:-1]
            block = c.num_blocks - len(mtp) + int(name.split(".")[1])
            natives.append(NativeSpec(name, block, "dspark", shapes, dtypes, optional))
    return Expected(tuple(groups), tuple(natives), tuple(superseded), dspark)


def _kind(block: int | None, kind: str, k: int, n: int, names: list[str]) -> GroupKind:
    if k % 128 or n % 128:
        raise ConfigError(
            f"config gives {kind} the shape {k} x {n}; EXL3 dimensions must be multiples of 128"
        )
    return GroupKind(block, kind, k, n, tuple(names))
