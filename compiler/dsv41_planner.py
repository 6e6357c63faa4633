"""One DeepSeek-V4.1 rank's segments, tensor by tensor: EXL3 groups, natives, Engram qk, expert tables."""

from __future__ import annotations

import math
import re

import numpy as np
from tfc.cache.contract import (
    LAYOUT_NATIVE,
    LAYOUT_RAGGED,
    LAYOUT_SCALES,
    LAYOUT_STACK,
    LAYOUT_TABLE_INDEX,
    LAYOUT_TRELLIS,
)
from tfc.compiler import exl3_slices as sl
from tfc.compiler.errors import PlanError
from tfc.compiler.segments import HELD_ITEMSIZE, STORED_HELD, STORED_NUMPY, Copy, SegmentPlan
from tfc.compiler.splits import Part, block_parts, even_parts
from tfc.packs.deepseek_v41_image import native_dtype, wo_a_groups

CODEBOOK_IDS = {"3inst": 0, "mcg": 1, "mul1": 2}
TABLE_ALIGN = 16

_BF16_ROUNDED = re.compile(r"weights_proj\.weight$")  # rounded to bf16, then held as float32


def held_dtype(name: str, stored: str) -> str:
    """The dtype a native tensor is held in on the device: the family's by name, else as stored."""
    return native_dtype(name) or STORED_HELD.get(stored, "uint8")


class RankPlanner:
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
        self.wo_a_groups = wo_a_groups(cfg, world, rank)
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

    def add(self, *fields, **sources) -> None:
        """Append a segment: SegmentPlan's fields name .. nbytes in order, then copies/const/derive/attrs."""
        self.segments.append(SegmentPlan(*fields, **sources))

    def add_scales(self, name: str, block: str, shape: tuple[int, ...], copies: tuple[Copy, ...]) -> None:
        """A float16 suh or svh segment (one vector, or one per expert table entry)."""
        self.add(name, block, "scales", LAYOUT_SCALES, "float16", shape, 2 * math.prod(shape), copies=copies)

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
        shape, nbytes = (tk, tn, group.width), tk * tn * group.tile_bytes
        self.add(f"{name}.trellis", block, "other_trellis", LAYOUT_TRELLIS, "int16", shape, nbytes,
                 copies=_one(trellis), attrs=attrs)  # fmt: skip
        self.add_scales(f"{name}.suh", block, (k,), _one(suh))
        self.add_scales(f"{name}.svh", block, (n,), _one(svh))
        if group.bias_row is not None and (split != "row" or self.rank == 0):
            bias = None
            if self.with_copies:
                bias = sl.vector_part(group.bias, part) if split == "column" else sl.whole(group.bias)
            self.add(
                f"{name}.bias", block, "natives", LAYOUT_NATIVE, "float16", (n,), 2 * n, copies=_one(bias)
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
        self.add(name, block, "natives", LAYOUT_NATIVE, held, shape, nbytes, copies=copies)

    def add_engram_qk(self, block: str) -> None:
        """Engram's q and k weights are used only through their product, bf16(q) * bf16(k) in f32."""
        index, table = self.pack.table.index, self.pack.table
        q_row, k_row = index[f"{block}.engram.q_weight"], index.get(f"{block}.engram.k_weight")
        shape = tuple(table.shapes[q_row])
        if k_row is None or tuple(table.shapes[k_row]) != shape:
            raise PlanError(f"{block}.engram.k_weight: missing or not shaped like engram.q_weight {shape}")
        derive = ("engram_qk", table.info(q_row), table.info(k_row)) if self.with_copies else ("engram_qk",)
        nbytes = int(np.prod(shape)) * 4
        self.add(
            f"{block}.engram.qk", block, "natives", LAYOUT_NATIVE, "float32", shape, nbytes, derive=derive
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
        self.add(f"{base}.trellis", block, "routed_trellis", layout, dtype, shape, offset,
                 copies=tuple(trellis_copies), attrs=attrs)  # fmt: skip
        for field_name, values, dtype_name in (
            ("offsets", offsets, "int64"),
            ("widths", widths, "int32"),
            ("codebooks", codebooks, "int32"),
        ):
            data = np.asarray(values, dtype=dtype_name).tobytes()
            name = f"{base}.{field_name}"
            self.add(name, block, "tables", LAYOUT_TABLE_INDEX, dtype_name, (entries,), len(data), const=data)
        self.add_scales(f"{base}.suh", block, (entries, k), tuple(suh_copies))
        self.add_scales(f"{base}.svh", block, (entries, n), tuple(svh_copies))


def _one(copy: Copy | None) -> tuple[Copy, ...]:
    return () if copy is None else (copy,)


def _at(copy: Copy, dst: int) -> Copy:
    return Copy(copy.file, copy.src, copy.run, copy.rows, copy.stride, dst, copy.convert)
