"""`tfc prepare` finds a pack's planner by the family the pack reports."""

from __future__ import annotations

import pytest
from tfc.compiler.dsv41_plan import plan_rank
from tfc.compiler.family import UnknownFamily, planner_for
from tfc.packs.deepseek_v41_contract import FAMILY


def test_deepseek_v41_is_registered():
    planner = planner_for(FAMILY)
    assert planner.name == FAMILY and planner.plan_rank is plan_rank


def test_unknown_family_is_one_plan_error():
    with pytest.raises(UnknownFamily, match="'llama' has no planner"):
        planner_for("llama")
