"""DeepSeek-V4.1 rank weight plans: which tensor each rank holds, split how, held in which dtype."""

from __future__ import annotations

import re

import numpy as np
from tfc.compiler import exl3_slices as sl
from tfc.compiler.errors import PlanError
from tfc.compiler.segments import (
    HELD_ITEMSIZE,
    LAYOUT_NATIVE,
    LAYOUT_RAGGED,
    LAYOUT_SCALES,
    LAYOUT_STACK,
    LAYOUT_TABLE_INDEX,
    LAYOUT_TRELLIS,
    STORED_HELD,
    STORED_NUMPY,
    Copy,
    RankPlan,
    SegmentPlan,
)
from tfc.compiler.splits import Part, block_parts, even_parts

WORLDS = (1, 2, 4, 8)
CODEBOOK_IDS = {"3inst": 0, "mcg": 1, "mul1": 2}
PROJECTIONS = ("w1", "w3", "w2")
TABLE_ALIGN = 16

_EXPERT = re.compile(r"^(?P<block>.+)\.ffn\.experts\.(?P<e>\d+)\.(?P<p>w[123])$")
_SHARED = re.compile(r"^(?P<block>.+)\.ffn\.shared_experts\.(?P<p>w[123])$")
_WO_A = re.compile(r"^(?P<block>.+)\.attn\.wo_a\.slice\.(?P<g>\d+)$")
_ENGRAM_TABLE = re.compile(r"\.engram\.embed\.(weight|scale)$")
_ENGRAM_QK = re.compile(r"^(?P<block>.+)\.engram\.(q|k)_weight$")

# Natives held in float32 (norms, mHC, sinks, selection bias, indexer weights), the rest by name.
_F32_NATIVE = re.compile(
    r"(norm\.weight|(^|\.)hc_[a-z_]+|attn_sink|gate\.bias|weights_proj\.weight|confidence_head\.proj\.weight)$"
)
_BF16_NATIVE = re.compile(r"(ffn\.gate\.weight|^embed\.weight|markov_head\.(embed|head)\.weight)$")
_BF16_ROUNDED = re.compile(r"weights_proj\.weight$")  # rounded to bf16, then held as float32


def check_world(config, world: int) -> None:
    """Refuse a TP world the model cannot be split over."""
    if world not in WORLDS:
        raise PlanError(f"TP world {world} is not supported; use one of {', '.join(map(str, WORLDS))}")
    if config.num_attention_heads % world:
        raise PlanError(f"{config.num_attention_heads} attention heads do not divide among {world} ranks")
    if config.o_groups % world:
        raise PlanError(f"{config.o_groups} wo_a groups (o_groups) do not divide among {world} ranks")


def held_dtype(name: str, stored: str) -> str:
    """The dtype a native tensor is held in on the device."""
    if _F32_NATIVE.search(name):
        return "float32"
    if _BF16_NATIVE.search(name):
        return "bfloat16"
    return STORED_HELD.get(stored, "uint8")


def split_of(name: str) -> str:
    """How an EXL3 group (not a routed or shared expert) is split across ranks."""
    if name == "head" or name.endswith(".attn.wq_b"):
        return "column"
    if name.endswith(".attn.wo_b"):
        return "row"
    return "whole"


class _Planner:
    """Builds one rank's segments from an opened pack."""

    def __init__(self, pack, world: int, rank: int):
        self.pack, self.config, self.world, self.rank = pack, pack.config, world, rank
        cfg = self.config
        self.head_cols = even_parts(cfg.num_attention_heads * cfg.head_dim, world, cfg.head_dim, "attn.wq_b")[rank]
        self.group_rows = even_parts(cfg.o_groups * cfg.o_lora_rank, world, cfg.o_lora_rank, "attn.wo_b")[rank]
        self.heads = even_parts(cfg.num_attention_heads, world, 1, "attn.attn_sink")[rank]
        self.vocab = block_parts(cfg.vocab_size, world, "vocabulary (head, embed)")[rank]
        per = cfg.o_groups // world
        self.wo_a_groups = range(rank * per, (rank + 1) * per)
        self.segments: list[SegmentPlan] = []

    def part_for(self, name: str, split: str, group) -> Part | None:
        """This rank's part of a group's split dimension."""
        if split == "whole":
            return None
        if name == "head":
            return self.vocab
        if name.endswith(".attn.wq_b"):
            return self.head_cols
        if name.endswith(".attn.wo_b"):
            return self.group_rows
        extent = group.n if split == "column" else group.k
        return block_parts(extent, self.world, name)[self.rank]

    def add(self, **fields) -> None:
        self.segments.append(SegmentPlan(**fields))

    def add_group(self, name: str, block: str, group, split: str) -> None:
        """A non-expert EXL3 group: its trellis slice and its two scale vectors."""
        part = self.part_for(name, split, group)
        (k, n), trellis, suh, svh = sl.group_slice(group, split, part)
        tk, tn = k // sl.TILE, n // sl.TILE
        attrs = {"codebook": group.codebook, "bits": group.bits, "k": k, "n": n, "split": split}
        if part is not None:
            attrs["part"] = [part.start, part.stop]
        self.add(
            name=f"{name}.trellis", block=block, kind="other_trellis", layout=LAYOUT_TRELLIS, dtype="int16",
            shape=(tk, tn, group.width), nbytes=trellis.out_bytes, copies=(trellis,), attrs=attrs,
        )
        self.add(name=f"{name}.suh", block=block, kind="scales", layout=LAYOUT_SCALES, dtype="float16",
                 shape=(k,), nbytes=suh.out_bytes, copies=(suh,))
        self.add(name=f"{name}.svh", block=block, kind="scales", layout=LAYOUT_SCALES, dtype="float16",
                 shape=(n,), nbytes=svh.out_bytes, copies=(svh,))
        if group.bias is not None and (split != "row" or self.rank == 0):
            bias = sl.vector_part(group.bias, part) if split == "column" else sl.whole(group.bias)
            self.add(name=f"{name}.bias", block=block, kind="natives", layout=LAYOUT_NATIVE, dtype="float16",
                     shape=(n,), nbytes=bias.out_bytes, copies=(bias,))

    def add_native(self, name: str, block: str, info) -> None:
        """A native tensor, widened or narrowed to its held dtype, split where the model splits it."""
        held = held_dtype(name, info.dtype)
        stored_item = np.dtype(STORED_NUMPY[info.dtype]).itemsize
        shape = tuple(info.shape)
        if name == "embed.weight":
            row_bytes = shape[1] * stored_item
            copy = Copy(info.file, info.offset + self.vocab.start * row_bytes, self.vocab.size * row_bytes)
            shape = (self.vocab.size, shape[1])
        elif name.endswith(".attn.attn_sink"):
            copy = sl.vector_part(info, self.heads, stored_item)
            shape = (self.heads.size,)
        else:
            copy = sl.whole(info)
        convert = None if STORED_HELD.get(info.dtype) == held else (info.dtype, held)
        if _BF16_ROUNDED.search(name):
            convert = (info.dtype, "float32_bf16")
        copy = Copy(copy.file, copy.src, copy.run, copy.rows, copy.stride, 0, convert)
        nbytes = int(np.prod(shape, dtype=np.int64)) * (HELD_ITEMSIZE.get(held) or stored_item)
        self.add(name=name, block=block, kind="natives", layout=LAYOUT_NATIVE, dtype=held, shape=shape,
                 nbytes=nbytes, copies=(copy,))

    def add_engram_qk(self, block: str) -> None:
        """Engram's q and k weights are used only through their product, bf16(q) * bf16(k) in f32."""
        q = self.pack.natives[f"{block}.engram.q_weight"]
        k = self.pack.natives.get(f"{block}.engram.k_weight")
        if k is None or tuple(k.shape) != tuple(q.shape):
            raise PlanError(f"{block}.engram.k_weight: missing or not shaped like engram.q_weight {q.shape}")
        shape = tuple(q.shape)
        self.add(name=f"{block}.engram.qk", block=block, kind="natives", layout=LAYOUT_NATIVE, dtype="float32",
                 shape=shape, nbytes=int(np.prod(shape)) * 4, derive=("engram_qk", q, k))

    def add_expert_tables(self, block: str, experts: dict[int, dict[str, object]], shared: dict[str, object]) -> None:
        """Per projection: the rank's routed expert slices then the shared expert's, in one table."""
        count = len(experts)
        if sorted(experts) != list(range(count)):
            raise PlanError(f"{block}: routed experts are not numbered 0..{count - 1}")
        for proj in PROJECTIONS:
            entries = [experts[e][proj] for e in range(count)]
            names = [f"{block}.ffn.experts.{e}.{proj}" for e in range(count)]
            if proj in shared:
                entries.append(shared[proj])
                names.append(f"{block}.ffn.shared_experts.{proj}")
            self._add_table(block, proj, names, entries, has_shared=proj in shared)

    def _add_table(self, block: str, proj: str, names: list[str], groups: list, has_shared: bool) -> None:
        split = "row" if proj == "w2" else "column"
        first = groups[0]
        for name, group in zip(names, groups, strict=True):
            if (group.k, group.n) != (first.k, first.n):
                raise PlanError(f"{name}: shape {group.k}x{group.n} differs from {names[0]} ({first.k}x{first.n})")
        part = block_parts(first.k if split == "row" else first.n, self.world, names[0])[self.rank]
        trellis_copies, suh_copies, svh_copies, offsets, widths, codebooks = [], [], [], [], [], []
        offset = 0
        k, n = first.k, first.n
        for group in groups:
            (k, n), trellis, suh, svh = sl.group_slice(group, split, part)
            offset = -(-offset // TABLE_ALIGN) * TABLE_ALIGN
            offsets.append(offset)
            widths.append(group.width)
            codebooks.append(CODEBOOK_IDS[group.codebook])
            trellis_copies.append(_at(trellis, offset))
            suh_copies.append(_at(suh, len(suh_copies) * k * 2))
            svh_copies.append(_at(svh, len(svh_copies) * n * 2))
            offset += trellis.out_bytes
        entries = len(groups)
        uniform = len(set(widths)) == 1
        base = f"{block}.ffn.experts.{proj}"
        attrs = {"split": split, "k": k, "n": n, "entries": entries, "shared": has_shared,
                 "part": [part.start, part.stop], "widths": sorted(set(widths))}
        tk, tn = k // sl.TILE, n // sl.TILE
        shared_bytes = trellis_copies[-1].out_bytes if has_shared else 0
        if uniform:
            layout, dtype, shape = LAYOUT_STACK, "int16", (entries, tk, tn, widths[0])
        else:
            layout, dtype, shape = LAYOUT_RAGGED, "uint8", (offset,)
        routed = offset - shared_bytes
        # The shared entry sits in the same table; its bytes are reported as their own kind.
        self.add(name=f"{base}.trellis", block=block, kind="routed_trellis", layout=layout, dtype=dtype,
                 shape=shape, nbytes=offset, copies=tuple(trellis_copies),
                 attrs={**attrs, "routed_bytes": routed, "shared_bytes": shared_bytes})
        for field_name, values, dtype_name in (("offsets", offsets, "int64"), ("widths", widths, "int32"),
                                               ("codebooks", codebooks, "int32")):
            data = np.asarray(values, dtype=dtype_name).tobytes()
            self.add(name=f"{base}.{field_name}", block=block, kind="tables", layout=LAYOUT_TABLE_INDEX,
                     dtype=dtype_name, shape=(entries,), nbytes=len(data), const=data)
        self.add(name=f"{base}.suh", block=block, kind="scales", layout=LAYOUT_SCALES, dtype="float16",
                 shape=(entries, k), nbytes=entries * k * 2, copies=tuple(suh_copies))
        self.add(name=f"{base}.svh", block=block, kind="scales", layout=LAYOUT_SCALES, dtype="float16",
                 shape=(entries, n), nbytes=entries * n * 2, copies=tuple(svh_copies))


def _at(copy: Copy, dst: int) -> Copy:
    return Copy(copy.file, copy.src, copy.run, copy.rows, copy.stride, dst, copy.convert)


def _block_of(name: str, prefixes: list[str]) -> str:
    for prefix in prefixes:
        if name.startswith(prefix + "."):
            return prefix
    return "top"


def plan_rank(pack, world: int, rank: int, engram_dir=None) -> RankPlan:
    """The exact segments of one rank's image, grouped by block in upload order."""
    from tfc.compiler.dsv41_engram_plan import EngramSources, engram_segments

    check_world(pack.config, world)
    if not 0 <= rank < world:
        raise PlanError(f"rank {rank} is outside a TP world of {world}")
    planner = _Planner(pack, world, rank)
    cfg = pack.config
    prefixes = [cfg.block_prefix(b) for b in range(cfg.num_blocks)]
    by_block: dict[str, list[str]] = {p: [] for p in [*prefixes, "top"]}
    for name in sorted(pack.groups):
        by_block[_block_of(name, prefixes)].append(name)
    natives_by_block: dict[str, list[str]] = {p: [] for p in by_block}
    for name in sorted(pack.natives):
        if not _ENGRAM_TABLE.search(name):
            natives_by_block[_block_of(name, prefixes)].append(name)
    for block in by_block:
        for name in natives_by_block[block]:
            if not _ENGRAM_QK.match(name):
                planner.add_native(name, block, pack.natives[name])
        if f"{block}.engram.q_weight" in pack.natives:
            planner.add_engram_qk(block)
        experts: dict[int, dict[str, object]] = {}
        shared: dict[str, object] = {}
        for name in by_block[block]:
            group = pack.groups[name]
            if m := _EXPERT.match(name):
                experts.setdefault(int(m["e"]), {})[m["p"]] = group
            elif m := _SHARED.match(name):
                shared[m["p"]] = group
            elif m := _WO_A.match(name):
                if int(m["g"]) in planner.wo_a_groups:
                    planner.add_group(name, block, group, "whole")
            else:
                planner.add_group(name, block, group, split_of(name))
        if experts:
            for e, projs in experts.items():
                missing = [p for p in PROJECTIONS if p not in projs]
                if missing:
                    raise PlanError(f"{block}.ffn.experts.{e}: missing projection(s) {', '.join(missing)}")
            planner.add_expert_tables(block, experts, shared)
    engram, _ = engram_segments(pack, world, rank, EngramSources(pack.tensors, engram_dir))
    order = {block: i for i, block in enumerate(by_block)}
    segments = sorted([*planner.segments, *engram], key=lambda s: order[s.block])
    return RankPlan(world, rank, tuple(segments))
