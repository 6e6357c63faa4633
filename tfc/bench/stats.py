"""Percentiles and a setting's summary: throughput, and TTFT / TPOT / ITL / latency at p50, p90, p99."""

from __future__ import annotations

import math
from collections.abc import Sequence

from tfc.bench.client import Outcome

QUANTILES = (50, 90, 99)
MAX_ERRORS = 5  # distinct error strings a summary keeps


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile by linear interpolation between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread_ms(seconds: Sequence[float]) -> dict[str, float | None]:
    """{p50, p90, p99} of durations in seconds, in milliseconds (None where there were no values)."""
    out = {}
    for q in QUANTILES:
        value = percentile(seconds, q)
        out[f"p{q}"] = None if value is None else round(value * 1000, 3)
    return out


def summarise(setting: dict, outcomes: Sequence[Outcome], duration_s: float) -> dict:
    """One setting's JSON object: counts, rates over the setting's wall time, latency spreads, first errors."""
    done = [o for o in outcomes if o.ok]
    output_tokens = sum(o.output_tokens for o in done)
    errors: list[str] = []
    for o in outcomes:
        if o.error is not None and o.error not in errors and len(errors) < MAX_ERRORS:
            errors.append(o.error)
    rate = (lambda n: round(n / duration_s, 3)) if duration_s > 0 else (lambda n: 0.0)
    return {
        **setting,
        "requests": len(outcomes),
        "ok": len(done),
        "failed": len(outcomes) - len(done),
        "duration_s": round(duration_s, 3),
        "output_tokens": output_tokens,
        "output_tok_s": rate(output_tokens),
        "request_s": rate(len(done)),
        "ttft_ms": spread_ms([o.ttft_s for o in done if o.ttft_s is not None]),
        "tpot_ms": spread_ms([o.tpot_s for o in done if o.tpot_s is not None]),
        "itl_ms": spread_ms([gap for o in done for gap in o.itl_s]),
        "latency_ms": spread_ms([o.latency_s for o in done]),
        "errors": errors,
    }
