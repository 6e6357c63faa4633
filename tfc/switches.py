"""On/off environment switches (TFC_GRAPHS, TFC_COMPILE, TFC_STAGE_CACHE, TFC_STAGE_KERNELS: on unless off;
TFC_PREFILL_STEPS: off unless on): one spelling of "off" and one of "on" for all."""

from __future__ import annotations

import os
from collections.abc import Mapping

OFF = ("0", "off", "false", "no")
ON = ("1", "on", "true", "yes")


def switched_on(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the opt-in switch `name` is set to on (1, on, true or yes, any case); unset means off."""
    return (os.environ if env is None else env).get(name, "").strip().lower() in ON


def switched_off(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the switch `name` is set to off (0, off, false or no, any case); unset means on."""
    return (os.environ if env is None else env).get(name, "").strip().lower() in OFF
