"""DeepSeek-V4.1 as a family of the planner registry: its TP check, its rank plan, its derived segments, its
placement rules."""

from __future__ import annotations

import re

from tfc.compiler.dsv41_engram_plan import fill_derived
from tfc.compiler.dsv41_kv import kv_bytes
from tfc.compiler.dsv41_plan import check_world, plan_rank
from tfc.compiler.family import FamilyPlanner
from tfc.compiler.placement import ENGRAM, EXPERTS, Movable, PlacementRules
from tfc.compiler.segments import SegmentPlan
from tfc.packs.deepseek_v41_contract import FAMILY

_BACKBONE = re.compile(r"^layers\.(\d+)$")


def movable(seg: SegmentPlan) -> Movable | None:
    """Engram rows, and a backbone layer's routed expert trellis tables (DSpark's drafting blocks stay put)."""
    if seg.kind == "engram_rows":
        return Movable(ENGRAM, int(seg.attrs["layer"]))
    m = _BACKBONE.match(seg.block)
    if seg.kind == "routed_trellis" and m:
        return Movable(EXPERTS, int(m[1]))
    return None


def context_kv_bytes(cfg, seqs: int, context: int) -> int:
    """KV bytes of `seqs` sequences of up to `context` tokens (the model's limit at most), on every rank."""
    return kv_bytes(cfg, seqs, min(context, cfg.max_position_embeddings))


PLANNER = FamilyPlanner(
    FAMILY, check_world, plan_rank, fill_derived, PlacementRules(movable, context_kv_bytes)
)
