"""The planner registry: a pack's family name gives what `tfc prepare` needs to plan and build its images."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tfc.compiler.errors import PlanError
from tfc.compiler.placement import PlacementRules
from tfc.packs import deepseek_v41_contract as dsv41


class UnknownFamily(PlanError):
    """A pack of a model family no planner is registered for."""


@dataclass(frozen=True)
class FamilyPlanner:
    """A family's planning: refuse a TP world, plan one rank, write the segments a plan derives, place them."""

    name: str
    check_world: Callable[[Any, int], None]
    plan_rank: Callable[..., Any]  # (pack, world, rank, engram_dir=None, with_copies=True) -> RankPlan
    fill_derived: Callable[..., None]  # (segment plan, reader, write(offset, bytes), memo) -> None
    placement: PlacementRules  # which segments may leave the device; the KV bytes of a context


# family name (as packs report it and manifests record it) -> module holding its PLANNER.
PLANNERS = {dsv41.FAMILY: "tfc.compiler.dsv41_family"}


def planner_for(name: str) -> FamilyPlanner:
    """The registered planner of a family, or one readable error."""
    if name not in PLANNERS:
        raise UnknownFamily(f"model family {name!r} has no planner (planned: {', '.join(PLANNERS)})")
    return importlib.import_module(PLANNERS[name]).PLANNER
