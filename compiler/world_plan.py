"""Every rank's plan of a TP world and where each segment lives: what `tfc plan` prints and `tfc prepare` builds."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from tfc.compiler.family import planner_for
from tfc.compiler.placement import Budget, Placement, place
from tfc.compiler.segments import RankPlan


@dataclass(frozen=True)
class WorldPlan:
    """The rank plans of one TP world, in rank order, and their placement."""

    plans: tuple[RankPlan, ...]
    placement: Placement


def plan_world(
    pack,
    world: int,
    budget: Budget | None = None,
    engram_dir: Path | None = None,
    copies: Collection[int] = (),
) -> WorldPlan:
    """Plan every rank (with the source copies of the ranks in `copies`, byte counts only for the rest) and place
    them for `budget` (all on the device without one); PlacementError when the target cannot hold them."""
    planner = planner_for(pack.family)
    planner.check_world(pack.config, world)
    plans = tuple(
        planner.plan_rank(pack, world, rank, engram_dir, with_copies=rank in copies) for rank in range(world)
    )
    return WorldPlan(plans, place(plans, planner.placement, pack.config, budget))
