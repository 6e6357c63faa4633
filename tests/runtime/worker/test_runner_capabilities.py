"""The runner protocol: the engine, warm-up, worker and TP leader go by what a runner states in its
`RunnerCapabilities`, never by which methods it happens to have; the worker refuses a runner whose stated
capabilities lack their methods."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch
from tfc.runtime.engine.engine import Engine, EngineConfig
from tfc.runtime.engine.prefix_cache import PrefixSettings
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams
from tfc.runtime.worker.runner import (
    CapabilityMissing,
    DraftAsk,
    RunnerCapabilities,
    check_capabilities,
    drafter_of,
    snapshots_of,
    stats_of,
)
from tfc.runtime.worker.step import Capacity, ModelInfo, StepOutput

VOCAB = 16


class Snap:
    """A slot's ids."""

    def __init__(self, ids: tuple[int, ...]) -> None:
        self.ids, self.nbytes = ids, 8

    def to_host(self) -> Snap:
        return self

    def to_bytes(self) -> bytes:
        return bytes(self.ids)


class EveryMethod:
    """A runner with every optional method (slots hold the ids fed; logits favour a function of them), stating
    only what `capabilities` says."""

    info = ModelInfo("test", VOCAB, 64, 0, (VOCAB - 1,))
    capacity = Capacity(2, 64)
    draft_block = 3

    def __init__(self, capabilities: RunnerCapabilities) -> None:
        self.capabilities = capabilities
        self.slots: dict[int, tuple[int, ...]] = {}
        self.asked: list[str] = []

    def execute(self, plan):
        out = []
        for row in plan.rows:
            self.slots[row.slot] = self.slots.get(row.slot, ())[: row.position] + tuple(row.tokens)
            logits = torch.zeros(VOCAB)
            logits[sum(self.slots[row.slot]) % (VOCAB - 1)] = 10.0
            out.append(logits)
        return StepOutput(tuple(out))

    def release(self, slot):
        self.slots.pop(slot, None)

    def snapshot(self, slot):
        self.asked.append("snapshot")
        return Snap(self.slots[slot])

    def restore(self, slot, snap):
        self.asked.append("restore")
        self.slots[slot] = snap.ids

    def load_snapshot(self, data):
        return Snap(tuple(data))

    def draft(self, asks, choose=None):
        self.asked.append("draft")
        return [() for _ in asks]

    def rollback(self, slot, position):
        self.asked.append("rollback")

    def warmup(self):
        self.asked.append("warmup")

    def stats(self):
        return {"notes": ["stated"]}

    def prefetch(self, upcoming):
        self.asked.append("prefetch")


class StepsOnly:
    """A runner that states capabilities it has no methods for."""

    info, capacity = EveryMethod.info, EveryMethod.capacity
    capabilities = RunnerCapabilities(snapshot=True, draft=True, stats=True, prefetch=True)

    def execute(self, plan): ...

    def release(self, slot): ...


ALL = RunnerCapabilities(snapshot=True, draft=True, warmup=True, stats=True, prefetch=True)


def test_the_engine_goes_by_what_the_runner_states():
    config = EngineConfig(max_seqs=2, max_context=64, chunk=4, prefix=PrefixSettings())
    silent = EveryMethod(RunnerCapabilities(draft_note="no DSpark blocks"))
    engine = Engine(silent, None, config)
    assert engine.prefix is None and "cannot snapshot" in engine.prefix_note
    assert engine.drafting.drafter is None and engine.drafting.note == "drafting off: no DSpark blocks"
    assert snapshots_of(silent) is None and drafter_of(silent) is None and stats_of(silent) == {}
    stated = EveryMethod(ALL)
    engine = Engine(stated, None, config)
    assert engine.prefix is not None and engine.snapshots is stated and engine.drafting.drafter is stated
    assert engine.drafting.note.startswith("drafting on: up to 3 tokens")
    assert stats_of(stated) == {"notes": ["stated"]}


def _cached_lengths(capabilities: RunnerCapabilities) -> list[int]:
    """The token counts of the states a 6-token prompt and its 4-token reply leave in the prefix cache."""
    config = EngineConfig(max_seqs=2, max_context=64, chunk=4, prefix=PrefixSettings(), draft=False)
    engine = Engine(EveryMethod(capabilities), type("Tok", (), {"decode": lambda *_, **__: ""})(), config)
    engine.start()

    async def go():
        (stream,) = engine.submit([Request((1, 2, 3, 4, 5, 6), SamplingParams(), 4)])
        return [e async for e in stream][-1]

    try:
        assert asyncio.run(go()).finish == "length"
        return sorted(e.tokens for e in engine.prefix._entries.values())
    finally:
        engine.close()


def _asked_to_prefetch(capabilities: RunnerCapabilities) -> bool:
    """Whether the engine told the runner of a long prompt's later chunks."""
    runner = EveryMethod(capabilities)
    config = EngineConfig(max_seqs=2, max_context=64, chunk=4, draft=False)
    engine = Engine(runner, type("Tok", (), {"decode": lambda *_, **__: ""})(), config)
    engine.start()

    async def go():
        (stream,) = engine.submit([Request(tuple(range(1, 13)), SamplingParams(), 2)])
        return [e async for e in stream][-1]

    try:
        assert asyncio.run(go()).finish == "length"
        return "prefetch" in runner.asked
    finally:
        engine.close()


def test_the_engine_reads_ahead_only_for_a_runner_that_states_it():
    assert _asked_to_prefetch(RunnerCapabilities(prefetch=True))
    assert not _asked_to_prefetch(RunnerCapabilities())


def test_a_runner_whose_prompt_rows_differ_has_its_prompt_states_cached_only():
    assert _cached_lengths(RunnerCapabilities(snapshot=True)) == [4, 6, 8, 9]
    assert _cached_lengths(RunnerCapabilities(snapshot=True, prompt_rows=True)) == [4, 6]


def test_a_runner_stating_what_it_cannot_do_is_refused():
    check_capabilities(EveryMethod(ALL), "img")
    check_capabilities(EveryMethod(RunnerCapabilities()), "img")
    with pytest.raises(
        CapabilityMissing, match=r"img: the StepsOnly states .*\(Snapshots, Drafter, Reports, Prefetches\)"
    ):
        check_capabilities(StepsOnly(), "img")


def test_the_worker_refuses_a_runner_that_lies_and_states_its_runners_capabilities(tiny_image):
    from tfc.runtime.models.family import Family
    from tfc.runtime.options import RuntimeOptions
    from tfc.runtime.worker.worker import Worker

    worker = Worker.start(tiny_image, device="cpu", options=RuntimeOptions(graphs=False))
    try:
        family = worker.family
        worker.family = Family(family.name, lambda *_, **__: StepsOnly(), family.chat_format)
        with pytest.raises(CapabilityMissing, match="Snapshots, Drafter, Reports, Prefetches"):
            worker.load_model(dtype=torch.float32, slots=2)
        worker.family = Family(family.name, lambda *_, **__: EveryMethod(ALL), family.chat_format)
        worker.load_model(dtype=torch.float32, slots=2)
        assert worker.capabilities == ALL and snapshots_of(worker) is worker and drafter_of(worker) is worker
        worker.warm_up()  # graphs off: the runner's warm-up is not asked for
        worker.draft([DraftAsk(0, 1, 2)])
        assert worker.runner.asked == ["draft"] and worker.draft_block == 3
        worker.runner = EveryMethod(RunnerCapabilities())  # the worker says why it cannot draft
        assert worker.capabilities.draft_note == "the reference forward has no drafter yet"
        assert worker.draft_block == 0 and snapshots_of(worker) is None
    finally:
        worker.close()


def test_a_tp_leader_states_steps_only_and_the_ranks_prompt_rows():
    from tfc.runtime.parallel.control import Leader

    leader = Leader.__new__(Leader)  # no world: only what it states is read
    leader.worker = EveryMethod(replace(ALL, prompt_rows=True))
    caps = leader.capabilities
    assert (
        not (caps.snapshot or caps.draft or caps.warmup or caps.stats or caps.prefetch) and caps.prompt_rows
    )
    assert caps.draft_note == "TP>1: the DSpark drafter runs at TP=1 only"
    assert snapshots_of(leader) is None and drafter_of(leader) is None
