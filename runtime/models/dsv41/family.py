"""DeepSeek-V4.1 as a family of the registry: its reference runner and its chat format."""

from __future__ import annotations

from tfc.packs.deepseek_v41_contract import FAMILY as NAME
from tfc.runtime.models.dsv41.chat import Dsv41ChatFormat
from tfc.runtime.models.dsv41.runner import build_reference
from tfc.runtime.models.family import Family

FAMILY = Family(NAME, build_reference, Dsv41ChatFormat)
