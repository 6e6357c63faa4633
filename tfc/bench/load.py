"""A sweep of settings, one after another: at most C requests in flight, or Poisson arrivals at R requests/s."""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import httpx2

from tfc.bench import BenchError
from tfc.bench.client import ENDPOINTS, Outcome, RequestShape, served_models, stream_one
from tfc.bench.prompts import PromptSource
from tfc.bench.stats import summarise

MIN_REQUESTS = 64  # a setting's default request count, or 4 per slot of its concurrency when that is more
DEFAULT_CONCURRENCY = (1, 4, 16, 64)
MAX_CONCURRENCY = 10_000  # past this a client runs out of sockets before the server of any engine fills up


@dataclass(frozen=True)
class Setting:
    """One point of the sweep: `concurrency` (requests in flight at most) or `rate` (Poisson arrivals per s)."""

    kind: str
    value: float
    requests: int

    def key(self) -> dict:
        """The setting as its summary's first key: {"concurrency": 4}, {"rate": 2.5} or {"rate": "inf"}."""
        if self.kind == "concurrency":
            return {"concurrency": int(self.value)}
        return {"rate": self.value if math.isfinite(self.value) else "inf"}

    @property
    def label(self) -> str:
        """`concurrency 4`, `rate 2.5/s`, `rate inf`."""
        if self.kind == "concurrency":
            return f"concurrency {int(self.value)}"
        return f"rate {self.value:g}/s" if math.isfinite(self.value) else "rate inf"


@dataclass(frozen=True)
class Plan:
    """Everything a run needs but its prompts."""

    base: str
    endpoint: str
    settings: tuple[Setting, ...]
    max_tokens: int
    model: str | None = None
    ignore_eos: bool = False
    api_key: str | None = None
    timeout_s: float = 600.0
    warmup: int = 0
    seed: int = 0


class Reporter(Protocol):
    """Where a run says how it goes (the command's progress bar and tables)."""

    def started(self, model: str, url: str, settings: Sequence[Setting]) -> None: ...
    def warmed_up(self, outcomes: Sequence[Outcome]) -> None: ...
    def setting_started(self, setting: Setting) -> None: ...
    def request_done(self, outcome: Outcome) -> None: ...
    def setting_done(self, summary: dict) -> None: ...


def parse_concurrency(text: str) -> list[int]:
    """`1,4,16,64` as positive integers (ValueError naming the bad item)."""
    values = []
    for item in _items(text):
        if not item.isdigit() or not 1 <= int(item) <= MAX_CONCURRENCY:
            raise ValueError(f"{item!r} is not a whole number from 1 to {MAX_CONCURRENCY}")
        values.append(int(item))
    return values


def parse_rates(text: str) -> list[float]:
    """`0.5,2,inf` as positive request rates per second (ValueError naming the bad item)."""
    values = []
    for item in _items(text):
        try:
            value = float(item)
        except ValueError:
            value = math.nan
        if not value > 0 or (math.isinf(value) and item.lower() not in ("inf", "+inf")):
            raise ValueError(f"{item!r} is not a positive rate (a number, or inf)")
        values.append(value)
    return values


def _items(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not items or "" in items:
        raise ValueError(f"{text!r} is not a comma-separated list")
    return items


def sweep(
    concurrency: Sequence[int] | None, rates: Sequence[float] | None, requests: int | None
) -> tuple[Setting, ...]:
    """The settings to run in order (concurrency 1, 4, 16, 64 unless told); each sends `requests`, or by default
    64 (4 per slot of the concurrency if that is more)."""
    if rates is not None:
        return tuple(Setting("rate", r, requests or MIN_REQUESTS) for r in rates)
    return tuple(
        Setting("concurrency", c, requests or max(MIN_REQUESTS, 4 * c))
        for c in concurrency or DEFAULT_CONCURRENCY
    )


def poisson_offsets(n: int, rate: float, rng: random.Random) -> list[float]:
    """Send times (seconds from the start) of `n` Poisson arrivals at `rate` per second: the first at 0, then
    exponential gaps of mean 1/rate; all at 0 when the rate is infinite."""
    if math.isinf(rate):
        return [0.0] * n
    offsets, at = [], 0.0
    for i in range(n):
        if i:
            at += rng.expovariate(rate)
        offsets.append(at)
    return offsets


async def run(plan: Plan, prompts: PromptSource, reporter: Reporter) -> list[dict]:
    """Probe the server, warm it up, run every setting; one summary per setting, in order."""
    headers = {"Authorization": f"Bearer {plan.api_key}"} if plan.api_key else {}
    limits = httpx2.Limits(max_connections=None, max_keepalive_connections=None)  # rate inf opens them all
    async with httpx2.AsyncClient(headers=headers, limits=limits, timeout=plan.timeout_s) as client:
        served = await served_models(client, plan.base)
        if plan.model is not None and plan.model not in served:
            raise BenchError(f"{plan.base} does not serve {plan.model!r} (it serves {', '.join(served)})")
        shape = RequestShape(plan.endpoint, plan.model or served[0], plan.max_tokens, plan.ignore_eos)
        url = plan.base + ENDPOINTS[plan.endpoint]
        reporter.started(shape.model, url, plan.settings)
        if plan.warmup:
            warm = Setting("concurrency", plan.warmup, plan.warmup)
            bodies = [shape.body(p) for p in prompts.take(warm.requests)]
            outcomes, _ = await _run_setting(client, url, bodies, warm, plan.timeout_s, None, lambda _: None)
            reporter.warmed_up(outcomes)
        schedule_rng = random.Random(plan.seed)
        summaries = []
        for setting in plan.settings:
            bodies = [shape.body(p) for p in prompts.take(setting.requests)]
            reporter.setting_started(setting)
            outcomes, duration = await _run_setting(
                client, url, bodies, setting, plan.timeout_s, schedule_rng, reporter.request_done
            )
            about = {"model": shape.model, "endpoint": plan.endpoint}
            summary = summarise(setting.key(), outcomes, duration) | about
            reporter.setting_done(summary)
            summaries.append(summary)
        return summaries


async def _run_setting(
    client: httpx2.AsyncClient,
    url: str,
    bodies: Sequence[dict],
    setting: Setting,
    timeout_s: float,
    rng: random.Random | None,
    done: Callable[[Outcome], None],
) -> tuple[list[Outcome], float]:
    """Every request of one setting; (outcomes in send order, seconds from the first send to the last reply)."""
    outcomes: list = [None] * len(bodies)  # each filled in place as its reply ends

    async def send(i: int) -> None:
        outcomes[i] = await stream_one(client, url, bodies[i], timeout_s)
        done(outcomes[i])

    start = time.perf_counter()
    if setting.kind == "concurrency":
        pending = iter(range(len(bodies)))

        async def slot() -> None:
            for i in pending:
                await send(i)

        await asyncio.gather(*(slot() for _ in range(min(int(setting.value), len(bodies)))))
    else:
        tasks = []
        for i, at in enumerate(poisson_offsets(len(bodies), setting.value, rng)):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i)))
        await asyncio.gather(*tasks)
    return outcomes, time.perf_counter() - start
