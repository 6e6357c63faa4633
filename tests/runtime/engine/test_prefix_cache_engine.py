"""The engine with a prefix cache over the tiny image's reference runner: resumed == fresh by token_sha and
logprobs to the bit (greedy and seeded) from every kind of boundary and from each tier; concurrency, cancellation and eviction leave
nothing pinned, held or leaked. The tiny model: a 32-token window, a ratio-2 compressor (layer 2), Engram
layers 1 and 2 hashing n-grams of up to 4 ids."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
import torch
from tfc.runtime.engine.engine import Engine, EngineConfig
from tfc.runtime.engine.generate import token_sha
from tfc.runtime.engine.prefix_cache import PrefixChain, PrefixSettings
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams
from tfc.runtime.models.dsv41.reference.state_io import StateFormatError, state_from_bytes, state_to_bytes

CHUNK = 16  # prefill chunk = the cache's page
PROMPT = tuple(torch.randint(0, 640, (41,), generator=torch.Generator().manual_seed(7)).tolist())
OTHER = tuple(reversed(PROMPT))
GEN = 4
PARAMS = {
    "greedy": SamplingParams(temperature=0.0),
    "seeded": SamplingParams(temperature=1.0, top_p=0.9, seed=11),
}
BOUNDARIES = {
    "engram": 6,  # the next ids' 4-grams reach back over it into the restored history
    "group": 13,  # inside a ratio-2 compressor group: one row pending
    "window": 32,  # at the window's edge (and a page's): the next id overwrites the ring's first slot
    "wrapped": 37,  # past the window (the ring has wrapped), inside a group again
}
TIERS = {
    "device": lambda tmp: PrefixSettings(),
    "host": lambda tmp: PrefixSettings(device_bytes=0, host_bytes=1 << 30),
    "disk": lambda tmp: PrefixSettings(device_bytes=0, host_bytes=0, disk=tmp / "disk"),
}
CASES = [("device", b) for b in BOUNDARIES] + [(t, b) for t in ("host", "disk") for b in ("group", "wrapped")]


def _engine(runner, prefix: PrefixSettings | None, tokenizer) -> Engine:
    engine = Engine(runner, tokenizer, EngineConfig(max_seqs=4, max_context=512, chunk=CHUNK, prefix=prefix))
    engine.start()
    return engine


def _run(engine: Engine, requests: list[Request]) -> list:
    """Each request's last event, its `logprobs` replaced by those of every event."""

    async def go():
        streams = engine.submit(requests)

        async def last(stream):
            logprobs = []
            async for event in stream:
                logprobs.extend(event.logprobs)
                if event.finish:
                    return replace(event, logprobs=tuple(logprobs))

        return await asyncio.gather(*[last(s) for s in streams])

    return asyncio.run(go())


def _request(prompt, params="greedy", gen=GEN) -> Request:
    return Request(tuple(prompt), PARAMS[params], gen, logprobs=4)


def _same(event, fresh_one) -> bool:
    """Same ids (token_sha) and the same logprobs to the last bit: the logits were the fresh run's."""
    return (token_sha(event.tokens), event.logprobs) == fresh_one


@pytest.fixture(scope="module")
def fresh(worker):
    """token_sha of each (prompt, params) with no prefix cache."""
    engine = _engine(worker, None, worker.tokenizer)
    try:
        assert engine.prefix is None and engine.prefix_note == "prefix cache off"
        keys = [(PROMPT, "greedy"), (PROMPT, "seeded"), (OTHER, "greedy")]
        events = _run(engine, [_request(p, k) for p, k in keys])
    finally:
        engine.close()
    return {key: (token_sha(e.tokens), e.logprobs) for key, e in zip(keys, events, strict=True)}


def _metric(engine: Engine, name: str, **labels) -> float:
    value = engine.metrics.registry.get_sample_value(f"tfc:{name}", {"model_name": "model", **labels})
    return value or 0.0


def _settled(engine: Engine, worker) -> None:
    """Nothing running, every slot free and empty, nothing pinned, each tier within its budget."""
    deadline = time.monotonic() + 10
    while engine.counts() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert engine.counts() == (0, 0) and sorted(engine._free) == list(range(engine.slots))
    assert worker.runner._states == {}
    stats = engine.prefix_stats()
    assert stats["pinned"] == 0
    assert all(t["bytes"] <= t["budget"] for t in stats["tiers"].values())
    assert stats["entries"] == sum(t["entries"] for t in stats["tiers"].values())


@pytest.mark.parametrize(("tier", "boundary"), CASES)
def test_resumed_equals_fresh(worker, fresh, tmp_path, tier, boundary):
    b = BOUNDARIES[boundary]
    engine = _engine(worker, TIERS[tier](tmp_path), worker.tokenizer)
    try:
        (first,) = _run(engine, [_request(PROMPT[:b], gen=1)])
        assert first.usage.cached_tokens == 0
        greedy, seeded = _run(engine, [_request(PROMPT, "greedy"), _request(PROMPT, "seeded")])
        assert greedy.usage.cached_tokens == seeded.usage.cached_tokens == b
        assert _same(greedy, fresh[(PROMPT, "greedy")]) and _same(seeded, fresh[(PROMPT, "seeded")])
        assert _metric(engine, "prefix_cache_tier_hits_total", tier=tier) == 2
        assert _metric(engine, "prefix_cache_hits_total") == 2 * b
        assert _metric(engine, "prefix_cache_queries_total") == b + 2 * len(PROMPT)
        assert _metric(engine, "cached_tokens_total") == 2 * b
        assert _metric(engine, "prefix_cache_bytes", tier=tier) > 0
        _settled(engine, worker)
    finally:
        engine.close()
    if tier == "disk":
        assert not list((tmp_path / "disk").glob("*.tfcprefix"))  # the files go with the server


def test_two_requests_sharing_a_prompt_at_once_keep_one_entry_per_prefix(worker, fresh):
    engine = _engine(worker, PrefixSettings(), worker.tokenizer)
    try:
        events = _run(engine, [_request(PROMPT, "greedy"), _request(PROMPT, "seeded")])
        assert _same(events[0], fresh[(PROMPT, "greedy")]) and _same(events[1], fresh[(PROMPT, "seeded")])
        assert [e.usage.cached_tokens for e in events] == [0, 0]
        keys = set()
        for e in events:
            fed = (*PROMPT, *e.tokens)[: len(PROMPT) + GEN - 1]
            chain = PrefixChain(CHUNK, fed)
            ends = {*range(CHUNK, len(fed) + 1, CHUNK), len(PROMPT), len(fed)}
            keys |= {chain.key(n) for n in ends}
        assert engine.prefix_stats()["entries"] == len(keys)
        _settled(engine, worker)
    finally:
        engine.close()


class CancelAt:
    """The worker, cancelling a stream when its `at`-th step has run."""

    def __init__(self, worker, at: int) -> None:
        self._worker, self.at, self.steps, self.stream = worker, at, 0, None

    def __getattr__(self, name):
        return getattr(self._worker, name)

    def execute(self, plan):
        out = self._worker.execute(plan)
        self.steps += 1
        if self.steps == self.at:
            self.stream.cancel()
        return out


def test_a_request_cancelled_mid_prefill_leaves_usable_states_and_nothing_held(worker, fresh):
    runner = CancelAt(worker, at=2)
    engine = _engine(runner, PrefixSettings(), worker.tokenizer)
    try:

        async def cancelled():
            (runner.stream,) = engine.submit([_request(PROMPT)])

        asyncio.run(cancelled())
        _settled(engine, worker)
        assert _metric(engine, "requests_aborted_total") == 1
        assert engine.prefix_stats()["entries"] == 2  # the two chunks it fed before it went
        (again,) = _run(engine, [_request(PROMPT)])
        assert again.usage.cached_tokens == 2 * CHUNK
        assert _same(again, fresh[(PROMPT, "greedy")])
        _settled(engine, worker)
    finally:
        engine.close()


def test_an_entry_pinned_by_a_resuming_request_is_not_evicted_by_another_coming_back(worker, fresh):
    one = 250_000  # bytes: any one tiny state up to 41 ids, never two
    engine = _engine(worker, PrefixSettings(device_bytes=one, host_bytes=1 << 30), worker.tokenizer)
    try:
        _run(engine, [_request(PROMPT[:20], gen=1)])  # 16, 20: 20 on the device, 16 below
        _run(engine, [_request(OTHER[:12], gen=1)])  # OTHER's 12 takes the device; PROMPT's 20 goes down
        assert engine.prefix_stats()["tiers"]["device"]["entries"] == 1
        # Admitted together: PROMPT resumes from the host and comes back up, which would push OTHER's 12
        # (pinned, not yet restored) out of the device.
        a, b = _run(engine, [_request(PROMPT), _request(OTHER)])
        assert (a.usage.cached_tokens, b.usage.cached_tokens) == (20, 12)
        assert _same(a, fresh[(PROMPT, "greedy")]) and _same(b, fresh[(OTHER, "greedy")])
        assert _metric(engine, "prefix_cache_tier_hits_total", tier="host") == 1
        assert _metric(engine, "prefix_cache_tier_hits_total", tier="device") == 1
        assert _metric(engine, "prefix_cache_evictions_total", tier="device") >= 2
        _settled(engine, worker)
    finally:
        engine.close()


def test_a_state_round_trips_through_its_bytes_and_refuses_others(worker):
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    worker.execute(StepPlan((SequenceStep(0, PROMPT[:37], 0),)))
    try:
        snap = worker.snapshot(0)
        data = snap.to_bytes()
        back = worker.load_snapshot(data)
        assert back.nbytes == snap.nbytes and back.state.tokens == list(PROMPT[:37])
        assert state_to_bytes(back.state) == data
        for layer, ring in snap.state.windows.items():
            assert torch.equal(ring.keys, back.state.windows[layer].keys)
        for layer, c in snap.state.compressors.items():
            got = back.state.compressors[layer]
            assert all(torch.equal(x, y) for x, y in zip(c.tensors(), got.tensors(), strict=True))
        bad = [data[:-1], b"X" + data[1:], data.replace(b'"position": 37', b'"position": 36'), data[:20]]
        for damaged in bad:
            with pytest.raises(StateFormatError):
                state_from_bytes(damaged)
    finally:
        worker.release(0)
