"""DeepSeek-V4.1 as a family of the planner registry: its TP check, its rank plan, its derived segments."""

from __future__ import annotations

from tfc.compiler.dsv41_engram_plan import fill_derived
from tfc.compiler.dsv41_plan import check_world, plan_rank
from tfc.compiler.family import FamilyPlanner
from tfc.packs.deepseek_v41_contract import FAMILY

PLANNER = FamilyPlanner(FAMILY, check_world, plan_rank, fill_derived)
