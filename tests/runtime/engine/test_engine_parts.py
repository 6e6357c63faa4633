"""The engine's parts on their own: keyed sampling, stop text, step planning, the engine loop over a stand-in runner."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tfc.runtime.engine.detok import StopText
from tfc.runtime.engine.engine import Engine, EngineConfig
from tfc.runtime.engine.request import Rejected, Request
from tfc.runtime.engine.sampling import (
    SamplingError,
    SamplingParams,
    draw,
    draw_rows,
    sample,
    sample_rows,
    sample_rows_on,
    uniform,
)
from tfc.runtime.engine.scheduler import Running, plan_step
from tfc.runtime.worker.runner import RunnerCapabilities
from tfc.runtime.worker.step import Capacity, ModelInfo, StepOutput


def test_sampling_depends_on_seed_and_position_only():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(500, generator=g)
    p = SamplingParams(temperature=1.0, seed=3)
    at = [sample(logits, p, 3, pos) for pos in range(40)]
    assert [sample(logits, p, 3, pos) for pos in reversed(range(40))] == at[::-1]  # call order is irrelevant
    assert len(set(at)) > 10 and at != [sample(logits, p, 4, pos) for pos in range(40)]
    assert 0 <= uniform(1, 2) < 1 and uniform(1, 2) != uniform(2, 1)


def test_filters_keep_what_they_say():
    logits = torch.tensor([0.0, 5.0, 1.0, 4.9, -2.0])
    draws = {sample(logits, SamplingParams(temperature=5.0, top_k=2, seed=0), 0, pos) for pos in range(200)}
    assert draws == {1, 3}
    assert {
        sample(logits, SamplingParams(temperature=1.0, top_p=0.3, seed=0), 0, pos) for pos in range(50)
    } == {1}
    near = {sample(logits, SamplingParams(temperature=1.0, min_p=0.5, seed=0), 0, pos) for pos in range(200)}
    assert near == {1, 3}  # p(3) / p(1) = e^-0.1 >= 0.5, the others are far below
    assert sample(logits, SamplingParams(), 0, 0) == 1
    for bad in (
        {"temperature": -1},
        {"top_p": 0},
        {"min_p": 2},
        {"top_k": -1},
        {"seed": -1},
        {"seed": 1 << 63},
    ):
        with pytest.raises(SamplingError):
            SamplingParams(**bad)


def test_draws_follow_the_softmax_of_the_tempered_logits():
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -30.0], dtype=torch.float64)
    p = SamplingParams(temperature=0.8)
    n = 6000
    counts = torch.bincount(torch.tensor([sample(logits, p, 5, pos) for pos in range(n)]), minlength=6)
    want = torch.softmax(logits / 0.8, 0)
    sigma = (want * (1 - want) / n).sqrt()
    assert ((counts / n - want).abs() <= 4 * sigma + 1e-9).all(), (counts / n, want)
    assert counts[5] == 0  # weight floor(e^-37.5 * 2^44) = 0: never drawn


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.7), SamplingParams(temperature=1.5, top_k=40),
                                    SamplingParams(temperature=1.0, top_p=0.9, min_p=0.01)])  # fmt: skip
def test_sorting_only_the_logits_near_the_top_changes_no_token(params):
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(20000, generator=g) * 12).double()  # a wide spread: most weights are 0
    for pos in range(64):
        u = uniform(9, pos)
        assert draw(logits, params, u, cut=True) == draw(logits, params, u, cut=False), pos


def test_rows_drawn_together_are_the_rows_drawn_alone():
    g = torch.Generator().manual_seed(2)
    logits = ((torch.randn(16, 3000, generator=g) * 6).round() / 4).double()  # ties, and a wide spread
    plain = [
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.0, min_p=0.05),
        SamplingParams(temperature=2.0),
    ]
    ranked = [SamplingParams(temperature=1.3, top_k=20), SamplingParams(temperature=0.9, top_p=0.8),
              SamplingParams(temperature=1.1, top_k=50, top_p=0.95, min_p=0.01)]  # fmt: skip
    for kinds in (plain, ranked):  # the batched draw a GPU makes (draw_rows), here on the CPU
        for trial in range(4):
            params = [kinds[(i + trial) % len(kinds)] for i in range(16)]
            us = [uniform(i, trial * 100 + 7 * i) for i in range(16)]
            alone = [draw(logits[i], params[i], us[i]) for i in range(16)]
            assert draw_rows(logits, params, us).tolist() == alone
    mixed = [SamplingParams(), *plain, *ranked] * 2 + [SamplingParams(), SamplingParams(temperature=0.5)]
    seeds, positions = list(range(16)), [3 * i for i in range(16)]
    alone = [sample(logits[i], mixed[i], seeds[i], positions[i]) for i in range(16)]
    assert sample_rows(logits, mixed, seeds, positions) == alone
    on = sample_rows_on(
        logits.float(), mixed, seeds, positions
    )  # as the drafter's walk asks: left on the device
    assert on.dtype == torch.long and on.tolist() == alone
    greedy = [SamplingParams()] * 3
    assert sample_rows_on(logits[:3], greedy, [0] * 3, [0] * 3).tolist() == logits[:3].argmax(1).tolist()


class CharTokenizer:
    """Token i is chr(97 + i)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(97 + i) for i in ids)


def test_stop_text_holds_back_a_partial_stop_and_cuts_at_a_whole_one():
    st = StopText(CharTokenizer(), ["cde"])
    assert st.add(0) == ("a", False) and st.add(1) == ("b", False)
    assert st.add(2) == ("", False)  # "c" may start "cde"
    assert st.add(3) == ("", False)
    assert st.add(4) == ("", True)  # "cde" found: nothing of it is released
    st = StopText(CharTokenizer(), ["cx"])
    assert st.add(2) == ("", False) and st.add(3) == ("cd", False)  # "cd" cannot become "cx"
    assert st.flush() == ""


def test_prefill_chunks_start_at_multiples_of_the_chunk_whatever_shares_the_step():
    a = Running(0, tuple(range(10)), fed=0)
    b = Running(1, tuple(range(3)), generated=[7], fed=3)
    plan = plan_step([a, b], chunk=4, budget=5)
    assert [(r.slot, r.tokens, r.position) for r in plan.rows] == [(1, (7,), 3), (0, (0, 1, 2, 3), 0)]
    a.fed = 4
    plan = plan_step([a], chunk=4, budget=5)
    assert plan.rows[0].tokens == (4, 5, 6, 7) and plan.rows[0].position == 4
    c = Running(2, tuple(range(8)), fed=0)
    plan = plan_step([b, a, c], chunk=4, budget=5)  # one chunk fits beside the decode row, the next waits
    assert [r.slot for r in plan.rows] == [1, 0]


def test_max_step_tokens_is_the_steps_budget():
    loose = EngineConfig(max_seqs=4, max_context=100, chunk=8)
    assert loose.budget(5) == 8 + 4 * 6 and loose.budget() == 12
    tight = EngineConfig(max_seqs=4, max_context=100, chunk=8, max_step_tokens=10)
    assert tight.budget(5) == tight.budget() == 10
    decoding = [Running(s, (1,), generated=[7], fed=1) for s in range(3)]
    prompt = Running(3, tuple(range(20)), fed=0)
    plan = plan_step([*decoding, prompt], chunk=8, budget=tight.budget())  # 3 decode rows + 8 > 10: it waits
    assert [r.slot for r in plan.rows] == [0, 1, 2]
    plan = plan_step([*decoding[:2], prompt], chunk=8, budget=tight.budget())
    assert [r.slot for r in plan.rows] == [0, 1, 3]


class CountingRunner:
    """A runner whose logits favour (position + slot-independent offset) % V: deterministic, batch-free."""

    info = ModelInfo("test", 16, 64, 0, (15,))
    capacity = Capacity(4, 64)
    capabilities = RunnerCapabilities()

    def __init__(self):
        self.released = []
        self.rows = []

    def execute(self, plan):
        self.rows.append(len(plan.rows))
        out = []
        for row in plan.rows:
            logits = torch.zeros(16)
            logits[(row.position + len(row.tokens) + sum(row.tokens)) % 15] = 10.0
            out.append(logits)
        return StepOutput(tuple(out))

    def release(self, slot):
        self.released.append(slot)


def _run(engine, requests):
    async def go():
        streams = engine.submit(requests)
        results = []
        for s in streams:
            async for ev in s:
                if ev.finish:
                    results.append((ev.tokens, ev.finish))
        return results

    return asyncio.run(go())


def test_engine_batches_admits_and_refuses():
    runner = CountingRunner()
    engine = Engine(runner, CharTokenizer(), EngineConfig(max_seqs=2, max_context=64, chunk=4, max_waiting=1))
    engine.start()
    try:
        reqs = [Request((1, 2, 3), SamplingParams(seed=0), 5, frozenset({15})) for _ in range(3)]
        solo = _run(engine, reqs[:1])
        together = _run(engine, reqs)
        assert together == solo * 3 and max(runner.rows) == 2  # two slots: never more than two rows a step
        with pytest.raises(Rejected) as too_long:
            engine.check(Request((1,) * 60, SamplingParams(seed=0), 10))
        assert too_long.value.status == 400 and too_long.value.code == "context_length_exceeded"
        with pytest.raises(Rejected) as bad_id:
            engine.check(Request((99,), SamplingParams(seed=0), 1))
        assert bad_id.value.status == 400
        engine.draining = True
        with pytest.raises(Rejected) as draining:
            engine.check(reqs[0])
        assert draining.value.status == 503 and draining.value.code == "server_restarting"
    finally:
        engine.close()
    assert set(runner.released) <= {0, 1}
