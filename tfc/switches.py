"""On/off environment switches (TFC_GRAPHS, TFC_COMPILE, TFC_STAGE_CACHE): one spelling of "off" for all."""

from __future__ import annotations

import os
from collections.abc import Mapping

OFF = ("0", "off", "false", "no")


def switched_off(name: str, env: Mapping[str, str] | None = None) -> bool:
    """Whether the switch `name` is set to off (0, off, false or no, any case); unset means on."""
    return (os.environ if env is None else env).get(name, "").strip().lower() in OFF
