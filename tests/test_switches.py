"""The one spelling of an environment switch's off."""

from __future__ import annotations

import pytest

from tfc.switches import switched_off, switched_on


@pytest.mark.parametrize("value", ["0", "off", "OFF", " false ", "No"])
def test_these_values_switch_off(value):
    assert switched_off("TFC_X", {"TFC_X": value})


@pytest.mark.parametrize("env", [{}, {"TFC_X": ""}, {"TFC_X": "1"}, {"TFC_X": "on"}, {"TFC_Y": "0"}])
def test_unset_or_anything_else_is_on(env):
    assert not switched_off("TFC_X", env)


@pytest.mark.parametrize(("env", "on"), [({}, False), ({"TFC_X": "0"}, False), ({"TFC_X": "maybe"}, False),
                                         ({"TFC_X": "1"}, True), ({"TFC_X": " ON "}, True), ({"TFC_X": "yes"}, True)])  # fmt: skip
def test_an_opt_in_switch_is_off_unless_set_on(env, on):
    assert switched_on("TFC_X", env) is on
