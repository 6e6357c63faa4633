"""Engram's part of a DeepSeek-V4.1 rank plan (hash assets, the rank's table rows) and its derived segments."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tfc.compiler import engram_assets as ea
from tfc.compiler.build import Reader
from tfc.compiler.convert import bf16_round, to_f32
from tfc.compiler.engram_map import TokenMap, build_token_map, check_token_map
from tfc.compiler.errors import BuildError, PlanError
from tfc.compiler.segments import SegmentPlan, Zeros
from tfc.packs.engram_layout import check_layout


@dataclass(frozen=True)
class EngramSources:
    """Where a plan finds the Engram tables: pack tensors plus an optional extra folder."""

    tensors: dict
    tables_dir: Path | None = None


def _sized_map(cfg) -> TokenMap:
    """A map of the planned shape (every id DEAD) used only for sizes and the non-map assets."""
    ids = np.full(cfg.vocab_size, -1, np.int32)
    return TokenMap(ids=ids, size=cfg.engram_compressed_vocab_size, digest="")


def token_map_for(pack) -> np.ndarray:
    """The compressed-token map of the pack's tokenizer, checked against its config, padded to vocab_size."""
    if pack.tokenizer_path is None:
        raise PlanError(f"{pack.root}: an Engram model needs tokenizer.json to build its token map")
    token_map = build_token_map(pack.tokenizer_path)
    check_token_map(token_map, pack.config, pack.tokenizer_path)
    if len(token_map) > pack.config.vocab_size:
        raise PlanError(
            f"{pack.tokenizer_path}: {len(token_map)} token ids exceed the config's vocab_size {pack.config.vocab_size}"
        )
    out = np.full(pack.config.vocab_size, -1, np.int32)  # ids past the tokenizer are DEAD
    out[: len(token_map)] = token_map.ids
    return out


def engram_segments(pack, world: int, rank: int, sources: EngramSources) -> tuple[list[SegmentPlan], bool]:
    """(segments, tables_present): assets go to block "top", each layer's rows to its own block."""
    cfg = pack.config
    if not cfg.engram_layer_ids:
        return [], False
    layout = check_layout(cfg)
    segments = []
    for asset in ea.asset_segments(layout, _sized_map(cfg), cfg, world, rank):
        is_map = asset.name == ea.SEG_TOKEN_MAP
        segments.append(
            SegmentPlan(
                name=asset.name,
                block="top",
                kind="engram_assets",
                layout=asset.layout,
                dtype=asset.dtype,
                shape=asset.shape,
                nbytes=asset.nbytes,
                const=None if is_map else asset.data.tobytes(),
                derive=("engram_token_map", pack) if is_map else None,
            )
        )
    tensors = dict(sources.tensors)
    if sources.tables_dir is not None:
        tensors.update(ea.table_tensors_in_dir(sources.tables_dir))
    tables = ea.find_tables(tensors, layout)
    if tables is None:
        return segments, False
    for row_seg in ea.row_segments(layout, tables, world, rank):
        block = row_seg.name.rsplit(".engram.", 1)[0]
        segments.append(
            SegmentPlan(
                name=row_seg.name,
                block=block,
                kind="engram_rows",
                layout=row_seg.layout,
                dtype=row_seg.dtype,
                shape=row_seg.shape,
                nbytes=row_seg.nbytes,
                derive=("engram_rows", row_seg),
                attrs={"lo": row_seg.lo, "hi": row_seg.hi, "layer": row_seg.table.layer_id},
                holes=ea.hole_bytes(row_seg),
            )
        )
    return segments, True


def fill_derived(
    seg: SegmentPlan, reader: Reader, write: Callable[[int, np.ndarray], None], memo: dict
) -> None:
    """Write a segment built from several tensors (or from the tokenizer) through `write(offset, bytes)`; rows a
    sparse source holds as holes come as `write(offset, Zeros(n))`."""
    kind = seg.derive[0]
    if kind == "engram_qk":
        q_info, k_info = seg.derive[1], seg.derive[2]
        q = to_f32(reader.read(q_info.file, q_info.offset, q_info.nbytes), q_info.dtype)
        k = to_f32(reader.read(k_info.file, k_info.offset, k_info.nbytes), k_info.dtype)
        write(0, (bf16_round(q) * bf16_round(k)).astype(np.float32).view(np.uint8))
    elif kind == "engram_token_map":
        if "token_map" not in memo:
            memo["token_map"] = token_map_for(seg.derive[1])
        write(0, memo["token_map"].view(np.uint8))
    elif kind == "engram_rows":
        ea.fill_rows(
            seg.derive[1],
            lambda offset, data: write(offset, np.frombuffer(data, np.uint8)),
            zeros=lambda offset, nbytes: write(offset, Zeros(nbytes)),
        )
    else:
        raise BuildError(f"{seg.name}: unknown derived segment kind {kind!r}")
