"""DeepSeek-V4.1 as a family of the registry: its runners (reference, fast) and its chat format."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfc.packs.deepseek_v41_contract import FAMILY as NAME
from tfc.runtime.models.dsv41.chat.format import Dsv41ChatFormat
from tfc.runtime.models.dsv41.reference.runner import build_reference
from tfc.runtime.models.family import Family

if TYPE_CHECKING:
    from tfc.runtime.worker.runner import ModelRunner

FAST_OPTIONS = ("tokens_per_slot", "kv_tokens", "exact", "prefill_rows", "tp_exact")  # only the fast runner's


def build_runner(opened: Any, *, kind: str = "reference", booted: Any = None, **options: Any) -> ModelRunner:
    """The runner of that kind: `fast` (kernels over the booted arena) or `reference` (dense, fp64-wide)."""
    fast = {k: options.pop(k) for k in FAST_OPTIONS if k in options}
    if kind == "fast":
        from tfc.runtime.models.dsv41.fast.build import build_fast

        return build_fast(booted, engram=options.get("engram", True), slots=options.get("slots"),
                          progress=options.get("progress"), comm=options.get("comm"), **fast)  # fmt: skip
    return build_reference(opened, off_device=getattr(booted, "off_device", None), **options)


FAMILY = Family(NAME, build_runner, Dsv41ChatFormat)
