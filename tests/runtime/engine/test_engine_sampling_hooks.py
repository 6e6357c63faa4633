"""The engine's sampling hooks: a constraint masks the logits, logprobs come from them, a reader's failure stays its own."""

from __future__ import annotations

import asyncio

import pytest
import torch
from tfc.fixtures.tokenizer import build_tokenizer
from tfc.runtime.engine.constraint import BannedTokens
from tfc.runtime.engine.engine import Engine, EngineConfig
from tfc.runtime.engine.grammar import Grammars
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams
from tfc.runtime.worker.runner import RunnerCapabilities
from tfc.runtime.worker.step import Capacity, ModelInfo, StepOutput

VOCAB = 640


def logits_at(token: int, position: int) -> torch.Tensor:
    """Logits that depend only on the last token fed and its position (what a model state would give)."""
    g = torch.Generator().manual_seed(token * 7919 + position)
    return torch.randn(VOCAB, generator=g, dtype=torch.float32) * 3


class FakeRunner:
    """A runner whose logits are a function of the last fed token and position."""

    info = ModelInfo("fake", VOCAB, 512, 0, (1,))
    capacity = Capacity(4, 512)
    capabilities = RunnerCapabilities()

    def execute(self, plan):
        return StepOutput(tuple(logits_at(r.tokens[-1], r.position + len(r.tokens) - 1) for r in plan.rows))

    def release(self, slot: int) -> None:
        pass


def run(requests: list[Request]) -> list[list]:
    """Every event of every request, run through a fresh engine."""

    async def go():
        engine = Engine(FakeRunner(), build_tokenizer(VOCAB), EngineConfig(max_seqs=4, max_context=512))
        engine.start()
        try:
            streams = engine.submit(requests)
            return await asyncio.gather(*[_all(s) for s in streams])
        finally:
            engine.close()

    return asyncio.run(go())


async def _all(stream) -> list:
    return [e async for e in stream]


PROMPT = (0, 300, 301, 302)


def test_logprobs_are_the_log_softmax_of_the_sampled_logits():
    events = run([Request(PROMPT, SamplingParams(), 6, logprobs=5)])[0]
    tokens = events[-1].tokens
    lps = [lp for e in events for lp in e.logprobs]
    assert [lp.token for lp in lps] == list(tokens)
    fed = [PROMPT[-1], *tokens[:-1]]
    for k, lp in enumerate(lps):
        ref = torch.log_softmax(logits_at(fed[k], len(PROMPT) - 1 + k).double(), 0)
        assert lp.logprob == pytest.approx(float(ref[lp.token]), abs=1e-9)
        assert [t for t, _ in lp.top] == torch.sort(ref, descending=True, stable=True).indices[:5].tolist()
        values = [v for _, v in lp.top]
        assert values == sorted(values, reverse=True) and sum(torch.tensor(values).exp()) <= 1
        assert lp.top[0][0] == lp.token  # greedy picks the most likely


def test_a_banned_token_is_never_picked_and_logprobs_see_the_mask():
    free = run([Request(PROMPT, SamplingParams(), 4, logprobs=1)])[0][-1].tokens
    ban = BannedTokens(VOCAB, frozenset({free[0]}))
    events = run([Request(PROMPT, SamplingParams(), 4, constraint=ban, logprobs=1)])[0]
    assert events[-1].tokens[0] != free[0]
    first = events[0].logprobs[0]
    ref = logits_at(PROMPT[-1], len(PROMPT) - 1).double()
    ref[free[0]] = float("-inf")
    assert first.logprob == pytest.approx(float(torch.log_softmax(ref, 0)[first.token]), abs=1e-9)


def test_a_grammar_holds_a_random_model_to_its_language():
    tok = build_tokenizer(VOCAB)
    grammars = Grammars(tok, VOCAB, (1,))
    lark = 'start: "yes" | "no" | %json {"type": "integer", "minimum": 10, "maximum": 99}'
    reqs = [Request(PROMPT, SamplingParams(temperature=1.0, seed=s), 16, frozenset({1}), constraint=grammars.compile(lark))
            for s in range(4)]  # fmt: skip
    for events in run(reqs):
        text = tok.decode(list(events[-1].tokens), skip_special_tokens=True)
        assert events[-1].finish == "stop" and (text in ("yes", "no") or 10 <= int(text) <= 99)


def test_constrained_and_logprob_requests_run_together_as_alone():
    tok = build_tokenizer(VOCAB)
    grammars = Grammars(tok, VOCAB, (1,))

    def reqs():
        return [
            Request(PROMPT, SamplingParams(temperature=0.8, seed=3), 12, frozenset({1}),
                    constraint=grammars.compile('start: %json {"type": "array", "maxItems": 3, "items": {"type": "boolean"}}')),
            Request((0, 5, 6), SamplingParams(temperature=1.0, seed=4), 10, logprobs=3),
            Request((0, 9), SamplingParams(), 8, constraint=BannedTokens(VOCAB, frozenset(range(100, 300)))),
        ]  # fmt: skip

    together = [e[-1].tokens for e in run(reqs())]
    alone = [run([r])[0][-1].tokens for r in reqs()]
    assert together == alone


def test_a_reader_that_fails_ends_only_its_request():
    class Broken:
        def add(self, token):
            raise ValueError("bad reader")

        def flush(self):
            return []

    ok, bad = run([Request(PROMPT, SamplingParams(), 3), Request(PROMPT, SamplingParams(), 3, reader=Broken)])
    assert ok[-1].finish == "length" and len(ok[-1].tokens) == 3
    assert bad[-1].finish == "error" and "bad reader" in bad[-1].error
