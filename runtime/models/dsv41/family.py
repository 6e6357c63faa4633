"""DeepSeek-V4.1 as a family of the registry: its reference runner and its chat format."""

from __future__ import annotations

from tfc.runtime.models.dsv41.chat import Dsv41ChatFormat
from tfc.runtime.models.dsv41.runner import build_reference
from tfc.runtime.models.family import Family

FAMILY = Family("deepseek_v41", build_reference, Dsv41ChatFormat)
