"""DeepSeek-V4.1 rank weight plans: which tensor each rank holds, split how, held in which dtype."""

from __future__ import annotations

import re

import numpy as np
from tfc.cache.contract import (
    LAYOUT_NATIVE,
    LAYOUT_RAGGED,
    LAYOUT_SCALES,
    LAYOUT_STACK,
    LAYOUT_TABLE_INDEX,
    LAYOUT_TOKENIZER,
    LAYOUT_TRELLIS,
)
from tfc.compiler import exl3_slices as sl
from tfc.compiler.errors import PlanError
from tfc.compiler.segments import (
    HELD_ITEMSIZE,
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
    """Builds one rank's segments from an opened pack; without copies it only counts bytes."""

    def __init__(self, pack, world: int, rank: int, with_copies: bool):
        self.pack, self.config, self.world, self.rank = pack, pack.config, world, rank
        self.with_copies = with_copies
        cfg = self.config
        self.head_cols = even_parts(cfg.num_attention_heads * cfg.head_dim, world, cfg.head_dim, "attn.wq_b")[
            rank
        ]
        self.group_rows = even_parts(cfg.o_groups * cfg.o_lora_rank, world, cfg.o_lora_rank, "attn.wo_b")[
            rank
        ]
        self.heads = even_parts(cfg.num_attention_heads, world, 1, "attn.attn_sink")[rank]
        self.vocab = block_parts(cfg.vocab_size, world, "vocabulary (head, embed)")[rank]
        per = cfg.o_groups // world
        self.wo_a_groups = range(rank * per, (rank + 1) * per)
        self.segments: list[SegmentPlan] = []

    def part_for(self, group, split: str) -> Part | None:
        """This rank's part of a group's split dimension."""
        name = group.name
        if split == "whole":
            return None
        if name == "head":
            return self.vocab
        if name.endswith(".attn.wq_b"):
            return self.head_cols
        if name.endswith(".attn.wo_b"):
            return self.group_rows
        return block_parts(group.n if split == "column" else group.k, self.world, name)[self.rank]

    def add(self, **fields) -> None:
        self.segments.append(SegmentPlan(**fields))

    def slice_of(
        self, group, split: str, part: Part | None
    ) -> tuple[int, int, tuple[Copy, Copy, Copy] | None]:
        """(k, n) of a rank's slice, and its trellis/suh/svh copies when they are wanted."""
        if self.with_copies:
            (k, n), trellis, suh, svh = sl.group_slice(group, split, part)
            return k, n, (trellis, suh, svh)
        if split == "column":
            return group.k, part.size, None
        if split == "row":
            return part.size, group.n, None
        return group.k, group.n, None

    def add_group(self, block: str, group, split: str) -> None:
        """A non-expert EXL3 group: its trellis slice and its two scale vectors."""
        part = self.part_for(group, split)
        k, n, copies = self.slice_of(group, split, part)
        trellis, suh, svh = copies or (None, None, None)
        tk, tn = k // sl.TILE, n // sl.TILE
        attrs = {"codebook": group.codebook, "bits": group.bits, "k": k, "n": n, "split": split}
        if part is not None:
            attrs["part"] = [part.start, part.stop]
        name = group.name
        self.add(
            name=f"{name}.trellis",
            block=block,
            kind="other_trellis",
            layout=LAYOUT_TRELLIS,
            dtype="int16",
            shape=(tk, tn, group.width),
            nbytes=tk * tn * group.tile_bytes,
            copies=_one(trellis),
            attrs=attrs,
        )
        self.add(
            name=f"{name}.suh",
            block=block,
            kind="scales",
            layout=LAYOUT_SCALES,
            dtype="float16",
            shape=(k,),
            nbytes=2 * k,
            copies=_one(suh),
        )
        self.add(
            name=f"{name}.svh",
            block=block,
            kind="scales",
            layout=LAYOUT_SCALES,
            dtype="float16",
            shape=(n,),
            nbytes=2 * n,
            copies=_one(svh),
        )
        if group.bias_row is not None and (split != "row" or self.rank == 0):
            bias = None
            if self.with_copies:
                bias = sl.vector_part(group.bias, part) if split == "column" else sl.whole(group.bias)
            self.add(
                name=f"{name}.bias",
                block=block,
                kind="natives",
                layout=LAYOUT_NATIVE,
                dtype="float16",
                shape=(n,),
                nbytes=2 * n,
                copies=_one(bias),
            )

    def add_native(self, block: str, name: str, row: int) -> None:
        """A native tensor, widened or narrowed to its held dtype, split where the model splits it."""
        table = self.pack.table
        stored, shape = table.dtypes[row], tuple(table.shapes[row])
        held = held_dtype(name, stored)
        stored_item = np.dtype(STORED_NUMPY[stored]).itemsize
        if name == "embed.weight":
            shape = (self.vocab.size, shape[1])
        elif name.endswith(".attn.attn_sink"):
            shape = (self.heads.size,)
        copies = ()
        if self.with_copies:
            info = table.info(row)
            if name == "embed.weight":
                row_bytes = shape[1] * stored_item
                copy = Copy(
                    info.file, info.offset + self.vocab.start * row_bytes, self.vocab.size * row_bytes
                )
            elif name.endswith(".attn.attn_sink"):
                copy = sl.vector_part(info, self.heads, stored_item)
            else:
                copy = sl.whole(info)
            convert = None if STORED_HELD.get(stored) == held else (stored, held)
            if _BF16_ROUNDED.search(name):
                convert = (stored, "float32_bf16")
            copies = (Copy(copy.file, copy.src, copy.run, copy.rows, copy.stride, 0, convert),)
        nbytes = int(np.prod(shape, dtype=np.int64)) * HELD_ITEMSIZE.get(held, stored_item)
        self.add(
            name=name,
            block=block,
            kind="natives",
            layout=LAYOUT_NATIVE,
            dtype=held,
            shape=shape,
            nbytes=nbytes,
            copies=copies,
        )

    def add_engram_qk(self, block: str) -> None:
        """Engram's q and k weights are used only through their product, bf16(q) * bf16(k) in f32."""
        index, table = self.pack.table.index, self.pack.table
        q_row, k_row = index[f"{block}.engram.q_weight"], index.get(f"{block}.engram.k_weight")
        shape = tuple(table.shapes[q_row])
        if k_row is None or tuple(table.shapes[k_row]) != shape:
            raise PlanError(f"{block}.engram.k_weight: missing or not shaped like engram.q_weight {shape}")
        derive = ("engram_qk", table.info(q_row), table.info(k_row)) if self.with_copies else ("engram_qk",)
        self.add(
            name=f"{block}.engram.qk",
            block=block,
            kind="natives",
            layout=LAYOUT_NATIVE,
            dtype="float32",
            shape=shape,
            nbytes=int(np.prod(shape)) * 4,
            derive=derive,
        )

    def add_table(self, block: str, proj: str, views: list) -> None:
        """One projection's expert table: the rank's routed slices, then the shared expert's (last)."""
        split = "row" if proj == "w2" else "column"
        first = views[0]
        for view in views:
            if (view.k, view.n) != (first.k, first.n):
                raise PlanError(
                    f"{view.names[0]}: shape {view.k}x{view.n} differs from {first.names[0]} ({first.k}x{first.n})"
                )
        part = block_parts(first.k if split == "row" else first.n, self.world, first.names[0])[self.rank]
        k, n = (part.size, first.n) if split == "row" else (first.k, part.size)
        tk, tn = k // sl.TILE, n // sl.TILE
        tiles = tk * tn
        names = [name for view in views for name in view.names]
        widths = [w for view in views for w in view.widths]
        codebooks = [CODEBOOK_IDS[c] for view in views for c in view.codebooks]
        # every entry is whole tiles of 2*W bytes, a multiple of 16, so entries stay 16-byte aligned
        sizes = np.asarray(widths, dtype=np.int64) * (2 * tiles)
        assert not (sizes % TABLE_ALIGN).any()
        offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).tolist()
        offset = int(sizes.sum())
        has_shared = ".shared_experts." in names[-1]
        trellis_copies, suh_copies, svh_copies = [], [], []
        if self.with_copies:
            routed = len(names) - has_shared
            groups = [group for view in views for group in view.groups]
            for i, group in enumerate(groups):
                if i < routed and group.name != f"{block}.ffn.experts.{i}.{proj}":
                    raise PlanError(
                        f"{block}: routed {proj} entry {i} is {group.name}; experts must be numbered 0..{routed - 1}"
                    )
                _, _, (trellis, suh, svh) = self.slice_of(group, split, part)
                trellis_copies.append(_at(trellis, offsets[i]))
                suh_copies.append(_at(suh, i * k * 2))
                svh_copies.append(_at(svh, i * n * 2))
        entries = len(names)
        shared_bytes = int(sizes[-1]) if has_shared else 0
        base = f"{block}.ffn.experts.{proj}"
        if len(set(widths)) == 1:
            layout, dtype, shape = LAYOUT_STACK, "int16", (entries, tk, tn, widths[0])
        else:
            layout, dtype, shape = LAYOUT_RAGGED, "uint8", (offset,)
        attrs = {
            "split": split,
            "k": k,
            "n": n,
            "entries": entries,
            "shared": has_shared,
            "part": [part.start, part.stop],
            "widths": sorted(set(widths)),
            "shared_bytes": shared_bytes,
        }
        # The shared entry sits in the routed table; RankPlan reports its bytes as their own kind.
        self.add(
            name=f"{base}.trellis",
            block=block,
            kind="routed_trellis",
            layout=layout,
            dtype=dtype,
            shape=shape,
            nbytes=offset,
            copies=tuple(trellis_copies),
            attrs=attrs,
        )
        for field_name, values, dtype_name in (
            ("offsets", offsets, "int64"),
            ("widths", widths, "int32"),
            ("codebooks", codebooks, "int32"),
        ):
            data = np.asarray(values, dtype=dtype_name).tobytes()
            self.add(
                name=f"{base}.{field_name}",
                block=block,
                kind="tables",
                layout=LAYOUT_TABLE_INDEX,
                dtype=dtype_name,
                shape=(entries,),
                nbytes=len(data),
                const=data,
            )
        self.add(
            name=f"{base}.suh",
            block=block,
            kind="scales",
            layout=LAYOUT_SCALES,
            dtype="float16",
            shape=(entries, k),
            nbytes=entries * k * 2,
            copies=tuple(suh_copies),
        )
        self.add(
            name=f"{base}.svh",
            block=block,
            kind="scales",
            layout=LAYOUT_SCALES,
            dtype="float16",
            shape=(entries, n),
            nbytes=entries * n * 2,
            copies=tuple(svh_copies),
        )


def _one(copy: Copy | None) -> tuple[Copy, ...]:
    return () if copy is None else (copy,)


def _at(copy: Copy, dst: int) -> Copy:
    return Copy(copy.file, copy.src, copy.run, copy.rows, copy.stride, dst, copy.convert)


def plan_rank(pack, world: int, rank: int, engram_dir=None, with_copies: bool = True) -> RankPlan:
    """The exact segments of one rank's image, grouped by block in upload order.

    Without copies the plan only counts bytes (what `tfc plan` prints); its sizes are the same.
    """
    from tfc.compiler.dsv41_engram_plan import EngramSources, engram_segments
    from tfc.compiler.pack_view import kinds, natives

    check_world(pack.config, world)
    if not 0 <= rank < world:
        raise PlanError(f"rank {rank} is outside a TP world of {world}")
    planner = _Planner(pack, world, rank, with_copies)
    cfg = pack.config
    blocks = [cfg.block_prefix(b) for b in range(cfg.num_blocks)] + ["top"]
    natives_by_block: dict[str, list[tuple[str, int]]] = {b: [] for b in blocks}
    for block, name, row in natives(pack):
        if not _ENGRAM_TABLE.search(name):
            natives_by_block[block].append((name, row))
    kinds_by_block: dict[str, list] = {b: [] for b in blocks}
    for view in kinds(pack):
        kinds_by_block[view.block].append(view)
    for block in blocks:
        for name, row in sorted(natives_by_block[block]):
            if not _ENGRAM_QK.match(name):
                planner.add_native(block, name, row)
        if f"{block}.engram.q_weight" in pack.native_rows:
            planner.add_engram_qk(block)
        tables: dict[str, list] = {}
        for view in sorted(kinds_by_block[block], key=lambda v: v.kind):
            if view.kind.startswith("ffn.experts."):
                tables.setdefault(view.kind.rsplit(".", 1)[1], []).append(view)
            elif view.kind.startswith("ffn.shared_experts."):
                tables.setdefault(view.kind.rsplit(".", 1)[1] + ".shared", []).append(view)
            else:
                for group in view.groups:
                    m = _WO_A.match(group.name)
                    if m and int(m["g"]) not in planner.wo_a_groups:
                        continue
                    planner.add_group(block, group, "whole" if m else split_of(group.name))
        for proj in PROJECTIONS:
            if proj in tables:
                planner.add_table(block, proj, tables[proj] + tables.get(proj + ".shared", []))
    index = pack.table.index
    names = [
        f"layers.{layer}.engram.embed.{part}"
        for layer in cfg.engram_layer_ids
        for part in ("weight", "scale")
    ]
    tables = {name: pack.table.info(index[name]) for name in names if name in index}
    engram, _ = engram_segments(pack, world, rank, EngramSources(tables, engram_dir))
    if pack.tokenizer_path is not None:
        # the runtime never reads the pack: the image carries the tokenizer it serves with
        size = pack.tokenizer_path.stat().st_size
        copies = (Copy(pack.tokenizer_path, 0, size),) if with_copies else ()
        engram.append(SegmentPlan(name="tokenizer.json", block="top", kind="tokenizer", layout=LAYOUT_TOKENIZER,
                                  dtype="uint8", shape=(size,), nbytes=size, copies=copies))  # fmt: skip
    order = {block: i for i, block in enumerate(blocks)}
    segments = sorted([*planner.segments, *engram], key=lambda s: order[s.block])
    return RankPlan(world, rank, tuple(segments))
