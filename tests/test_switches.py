"""The one spelling of an environment switch's off."""

from __future__ import annotations

import pytest

from tfc.switches import switched_off


@pytest.mark.parametrize("value", ["0", "off", "OFF", " false ", "No"])
def test_these_values_switch_off(value):
    assert switched_off("TFC_X", {"TFC_X": value})


@pytest.mark.parametrize("env", [{}, {"TFC_X": ""}, {"TFC_X": "1"}, {"TFC_X": "on"}, {"TFC_Y": "0"}])
def test_unset_or_anything_else_is_on(env):
    assert not switched_off("TFC_X", env)
