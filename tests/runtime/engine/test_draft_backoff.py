"""Draft back-off: a sequence whose drafts are never kept drafts less and less often (1, 2, 4 .. 16 steps apart),
one whose drafts are kept drafts every step; the tokens are serial decoding's either way."""

from __future__ import annotations

import pytest
import torch
from tfc.runtime.engine.draft_backoff import MAX_WAIT, DraftBackoff
from tfc.runtime.engine.generate import generate, token_sha
from tfc.runtime.engine.sampling import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

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


class Scripted:
    """Proposes the serial continuation, every draft wrong at its first token (`wrong`) or right."""

    block_size, target_layers = 5, ()

    def __init__(self, run: tuple[int, ...], wrong: bool) -> None:
        self.run, self.wrong, self.proposed = run, wrong, 0

    def propose(self, slot, tokens, last_token, k, choose) -> tuple[int, ...]:
        seen = (*tokens, last_token)
        draft = list(self.run[len(seen) : len(seen) + k])
        if self.wrong and draft:
            draft[0] = (draft[0] + 1) % 640
        self.proposed += 1
        return tuple(draft)

    def release(self, slot) -> None:
        pass


def test_a_drafter_that_never_agrees_costs_few_rounds(worker):
    (serial,) = generate(worker.runner, [PROMPT], GEN, SamplingParams(), draft=False)
    try:
        for wrong, most in ((True, 7), (False, GEN // 5)):
            worker.runner.drafter = script = Scripted(PROMPT + tuple(serial.tokens), wrong)
            (got,) = generate(worker.runner, [PROMPT], GEN, SamplingParams())
            assert token_sha(got.tokens) == token_sha(serial.tokens)
            assert script.proposed <= most and got.drafted.drafts == script.proposed
    finally:
        worker.runner.drafter = worker.dspark
