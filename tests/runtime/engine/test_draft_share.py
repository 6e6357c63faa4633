"""Drafts fill at most one product chunk of a step beside its decode rows: fewer as more streams decode, none
once their rows alone fill it; the tokens are serial decoding's either way."""

from __future__ import annotations

import pytest
import torch
from support.slot_drafters import OneAtATime
from tfc.runtime.engine.drafting import DRAFT_ROWS, propose, share
from tfc.runtime.engine.generate import generate, token_sha
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams
from tfc.runtime.engine.scheduler import Running


def test_each_stream_drafts_its_share_of_the_step():
    assert DRAFT_ROWS == 16
    assert [share(n, 16) for n in (1, 2, 3, 4, 5, 8, 9, 16, 64)] == [15, 7, 4, 3, 2, 1, 0, 0, 0]


class Counting:
    """A drafter stand-in: proposes k copies of the last token and notes every k asked for."""

    draft_block = 5

    def __init__(self) -> None:
        self.asked: list[int] = []
        self.calls = 0

    def draft(self, asks, choose) -> list[tuple[int, ...]]:
        self.calls += 1
        self.asked += [k for _, _, k in asks]
        return [(last_token,) * k for _, last_token, k in asks]


@pytest.mark.parametrize(("streams", "most"), [(1, 5), (3, 4), (8, 1), (9, 0), (64, 0)])
def test_the_engine_proposes_within_the_share(streams, most):
    drafts = Counting()
    work = [(Running(s, (1, 2), generated=[7], fed=2, drafting=True), Request((1, 2), SamplingParams(), 50))
            for s in range(streams)]  # fmt: skip
    work.append(
        (Running(99, (1,) * 40, fed=3, drafting=True), Request((1,) * 40, SamplingParams(), 50))
    )  # prefilling
    propose(drafts, work, 4096, DRAFT_ROWS)
    assert drafts.asked == ([most] * streams if most else []) and drafts.calls == (1 if most else 0)
    assert all(len(run.draft) == most for run, _ in work[:-1]) and work[-1][0].draft == ()


class Right(OneAtATime):
    """Proposes the serial continuation (every draft kept) and notes every k asked for."""

    block_size, target_layers = 5, ()

    def __init__(self, runs: list[tuple[int, ...]]) -> None:
        self.runs, self.asked = runs, []

    def propose_one(self, slot, tokens, last_token, k) -> tuple[int, ...]:
        self.asked.append(k)
        seen = len(tokens) + 1
        return tuple(self.runs[slot][seen : seen + k])

    def release(self, slot) -> None:
        pass


@pytest.mark.parametrize(("streams", "most"), [(2, 5), (8, 1)])  # 9 and more: none (the test above)
def test_generate_drafts_less_as_more_streams_decode(worker, streams, most):
    gen = torch.Generator().manual_seed(4)
    prompts = [tuple(torch.randint(3, 640, (6,), generator=gen).tolist()) for _ in range(streams)]
    serial = generate(worker.runner, prompts, 12, SamplingParams(), draft=False)
    try:
        worker.runner.drafter = script = Right(
            [p + tuple(g.tokens) for p, g in zip(prompts, serial, strict=True)]
        )
        got = generate(worker.runner, prompts, 12, SamplingParams())
        assert [token_sha(g.tokens) for g in got] == [token_sha(g.tokens) for g in serial]
        assert max(script.asked, default=0) == most and (most > 0) == bool(script.asked)
        assert len(script.asked) == streams * script.calls  # in lockstep: every round drafts them all at once
    finally:
        worker.runner.drafter = worker.dspark
