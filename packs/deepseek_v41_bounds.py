"""Bounds of a hostile DeepSeek-V4.1 config: nesting depth, integer size, ranges of the numbers the runtime uses."""

from __future__ import annotations

import math
from typing import Any

from tfc.packs.errors import ConfigError

MAX_DEPTH = (
    32  # lists and objects within one another; an image's manifest carries the config a few levels down
)
MAX_INT = 1 << 40  # any integer of the config, in magnitude
# Numbers the runtime computes with: field -> (low, whether low itself is allowed, high).
RANGES = {
    "rope_theta": (0.0, False, 1e15), "compress_rope_theta": (0.0, False, 1e15),
    "rms_norm_eps": (0.0, False, 1.0), "hc_eps": (0.0, True, 1.0), "swiglu_limit": (0.0, True, 1e6),
    "routed_scaling_factor": (0.0, False, 1e6), "hc_post_alpha": (0.0, False, 1e6),
    "engram_gate_clamp": (0.0, True, 1e6), "attention_dropout": (0.0, True, 1.0),
    "initializer_range": (0.0, True, 1e6), "max_position_embeddings": (1, True, 1 << 24),
    "hc_sinkhorn_iters": (1, True, 1000),
}  # fmt: skip
WITHIN_CONTEXT = ("sliding_window", "index_topk", "candidate_topk_blocks", "candidate_block_size")
ROPE_SCALING = ("factor", "beta_fast", "beta_slow", "original_max_position_embeddings")  # what YaRN reads


def check_json(raw: Any, where: str) -> None:
    """Refuse lists and objects nested deeper than MAX_DEPTH and non-finite numbers, naming where (no recursion)."""
    stack = [(raw, 1, "")]
    while stack:
        value, depth, at = stack.pop()
        if type(value) is float and not math.isfinite(value):  # NaN, Infinity and 1e400 parse as floats
            raise ConfigError(f"{where}: {at.lstrip('.')} = {value} is not a finite number")
        if type(value) in (dict, list):
            if depth > MAX_DEPTH:  # deeper values would break every later copy, digest and dump of them
                raise ConfigError(
                    f"{where}: JSON nested more than {MAX_DEPTH} levels deep (at {at.lstrip('.')[:80]})"
                )
            items = value.items() if type(value) is dict else enumerate(value)
            stack += [(v, depth + 1, f"{at}.{k}" if type(k) is str else f"{at}[{k}]") for k, v in items]


def check_ints(where: str, name: str, values) -> None:
    """Integers within ±MAX_INT."""
    if any(abs(v) > MAX_INT for v in values):
        raise ConfigError(f"{where}: {name} holds an integer beyond ±{MAX_INT:,}")


def check_ranges(c: Any, where: str) -> None:
    """The RANGES, the lengths that must fit the context, and rope_scaling's numbers."""
    for name, (lo, lo_ok, hi) in RANGES.items():
        v = getattr(c, name)
        if not ((lo <= v if lo_ok else lo < v) and v <= hi):
            raise ConfigError(f"{where}: {name} = {v} is outside {'[' if lo_ok else '('}{lo:g}, {hi:g}]")
    for name in WITHIN_CONTEXT:
        v = getattr(c, name)
        if v > c.max_position_embeddings:
            raise ConfigError(
                f"{where}: {name} = {v} exceeds max_position_embeddings {c.max_position_embeddings}"
            )
    scaling = c.rope_scaling or {}
    for key in ROPE_SCALING:
        v = scaling.get(key)
        if v is not None and (type(v) not in (int, float) or not math.isfinite(v) or not 0 < v <= 1e6):
            raise ConfigError(f"{where}: rope_scaling.{key} = {v!r:.40} is not a number in (0, 1e+06]")
    original = scaling.get("original_max_position_embeddings")
    if original is not None and (type(original) is not int or original > c.max_position_embeddings):
        raise ConfigError(
            f"{where}: rope_scaling.original_max_position_embeddings = {original!r:.40} is not an integer "
            f"up to max_position_embeddings {c.max_position_embeddings}"
        )
