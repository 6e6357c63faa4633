"""Draft back-off: a sequence whose drafts are never kept drafts less and less often (1, 2, 4 .. 16 steps apart),
one whose drafts are kept drafts every step; across sequences, rounds stop while the last 16 kept almost nothing,
but for a probe every 64 steps; the tokens are serial decoding's either way."""

from __future__ import annotations

import torch
from support.slot_drafters import OneAtATime
from tfc.runtime.engine.draft_backoff import (
    KEPT_FLOOR,
    MAX_WAIT,
    PROBE_STEPS,
    ROUNDS,
    DraftBackoff,
    DraftGate,
)
from tfc.runtime.engine.generate import generate, token_sha
from tfc.runtime.engine.sampling import SamplingParams

PROMPT = tuple(torch.randint(3, 640, (12,), generator=torch.Generator().manual_seed(9)).tolist())
GEN = 40


def test_the_wait_doubles_after_rejected_rounds_and_resets_after_a_kept_one():
    b, rounds = DraftBackoff(), []
    for step in range(60):
        if b.ready():
            rounds.append(step)
            b.after(0)
    assert rounds == [0, 2, 5, 10, 19, 36, 53]  # waits 1, 2, 4, 8, 16, 16
    b.after(3)
    assert b.ready() and b.wait == 0 and MAX_WAIT == 16


def test_the_gate_closes_after_rounds_that_keep_nothing_and_probes():
    gate = DraftGate()
    assert (ROUNDS, KEPT_FLOOR, PROBE_STEPS) == (16, 0.125, 64)
    for _ in range(ROUNDS - 1):
        assert gate.open()
        gate.after(0)
    gate.after(3)  # one kept of 16: under the floor (2)
    drafting = [step for step in range(200) if gate.open()]
    assert drafting == [63, 127, 191]  # one probing step in 64
    gate.after(1)  # a probe keeps a draft: 2 of the last 16, open again
    assert gate.open() and gate.open()


class Scripted(OneAtATime):
    """Proposes each slot's serial continuation (runs[slot]), every draft wrong at its first token (`wrong`) or
    right."""

    block_size, target_layers = 5, ()

    def __init__(self, runs: list[tuple[int, ...]], wrong: bool) -> None:
        self.runs, self.wrong, self.proposed = runs, wrong, 0

    def propose_one(self, slot, tokens, last_token, k) -> tuple[int, ...]:
        seen = (*tokens, last_token)
        draft = list(self.runs[slot][len(seen) : len(seen) + k])
        if self.wrong and draft:
            draft[0] = (draft[0] + 1) % 640
        self.proposed += 1
        return tuple(draft)

    def release(self, slot) -> None:
        pass


def test_rounds_of_many_sequences_stop_once_they_keep_nothing(worker):
    prompts = [
        tuple(torch.randint(3, 640, (8,), generator=torch.Generator().manual_seed(s)).tolist())
        for s in range(8)
    ]
    serial = generate(worker.runner, prompts, 20, SamplingParams(), draft=False)
    try:
        runs = [p + tuple(g.tokens) for p, g in zip(prompts, serial, strict=True)]
        worker.runner.drafter = script = Scripted(runs, wrong=True)
        got = generate(worker.runner, prompts, 20, SamplingParams())
        assert [token_sha(g.tokens) for g in got] == [token_sha(g.tokens) for g in serial]
        # each sequence alone would draft 5 times in 20 steps (40 rounds); the gate stops them after 16
        assert script.proposed == ROUNDS
    finally:
        worker.runner.drafter = worker.dspark


def test_a_drafter_that_never_agrees_costs_few_rounds(worker):
    (serial,) = generate(worker.runner, [PROMPT], GEN, SamplingParams(), draft=False)
    try:
        for wrong, most in ((True, 7), (False, GEN // 5)):
            worker.runner.drafter = script = Scripted([PROMPT + tuple(serial.tokens)], wrong)
            (got,) = generate(worker.runner, [PROMPT], GEN, SamplingParams())
            assert token_sha(got.tokens) == token_sha(serial.tokens)
            assert script.proposed <= most and got.drafted.drafts == script.proposed
    finally:
        worker.runner.drafter = worker.dspark
