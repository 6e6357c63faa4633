"""DeepSeek-V4.1 rank weight plans: which tensor each rank holds, split how, in upload order."""

from __future__ import annotations

import re

from tfc.cache.contract import LAYOUT_TOKENIZER
from tfc.compiler.dsv41_planner import RankPlanner
from tfc.compiler.errors import PlanError
from tfc.compiler.segments import Copy, RankPlan, SegmentPlan
from tfc.packs.deepseek_v41_image import group_split

WORLDS = (1, 2, 4, 8)
PROJECTIONS = ("w1", "w3", "w2")

_WO_A = re.compile(r"^(?P<block>.+)\.attn\.wo_a\.slice\.(?P<g>\d+)$")
_ENGRAM_TABLE = re.compile(r"\.engram\.embed\.(weight|scale)$")
_ENGRAM_QK = re.compile(r"^(?P<block>.+)\.engram\.(q|k)_weight$")


def check_world(config, world: int) -> None:
    """Refuse a TP world the model cannot be split over."""
    if world not in WORLDS:
        raise PlanError(f"TP world {world} is not supported; use one of {', '.join(map(str, WORLDS))}")
    if config.num_attention_heads % world:
        raise PlanError(f"{config.num_attention_heads} attention heads do not divide among {world} ranks")
    if config.o_groups % world:
        raise PlanError(f"{config.o_groups} wo_a groups (o_groups) do not divide among {world} ranks")


def plan_rank(pack, world: int, rank: int, engram_dir=None, with_copies: bool = True) -> RankPlan:
    """The exact segments of one rank's image, grouped by block in upload order.

    Without copies the plan only counts bytes (what `tfc plan` prints); its sizes are the same.
    """
    from tfc.compiler.dsv41_engram_plan import EngramSources, engram_segments
    from tfc.compiler.pack_view import kinds, natives

    check_world(pack.config, world)
    if not 0 <= rank < world:
        raise PlanError(f"rank {rank} is outside a TP world of {world}")
    planner = RankPlanner(pack, world, rank, with_copies)
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
                    planner.add_group(block, group, "whole" if m else group_split(group.name))
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
