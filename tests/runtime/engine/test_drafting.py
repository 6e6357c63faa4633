"""Draft-verify rounds on the tiny image's reference runner: drafted == serial, to the token and the logprob bit.

Random weights make the DSpark drafter's tokens almost never the model's, which would make drafted == serial
trivially true; so most tests put a scripted drafter into the runner's drafter hook. It proposes the serial
continuation (from a serial run of the same requests) with a deliberate error at an offset that cycles
through 0 (nothing accepted), a few, and none at all (all k accepted), so rounds accept 0, some and all of
their drafts. Everything is checked against serial decoding through the engine (`draft: false`) and through
`generate`: greedy and seeded, solo and 16 at once, constrained, with stops and limits inside a window.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
import torch
from support.scripted_drafter import Scripted
from tfc.runtime.engine.constraint import AllOf, BannedTokens
from tfc.runtime.engine.engine import Engine, EngineConfig
from tfc.runtime.engine.generate import generate, token_sha
from tfc.runtime.engine.grammar import Grammars
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams

VOCAB = 640
GEN = 8
SEEDS = torch.Generator().manual_seed(3)
PROMPTS = [tuple(torch.randint(3, VOCAB, (26 + i % 5,), generator=SEEDS).tolist()) for i in range(16)]
GREEDY = SamplingParams()
PARAMS = [GREEDY if i % 2 == 0 else SamplingParams(temperature=1.0, top_p=0.9, seed=i) for i in range(16)]


@pytest.fixture
def drafter(worker):
    """Put a drafter into the runner's hook for one test (the DSpark one comes back after)."""

    def put(d):
        worker.runner.drafter = d
        return d

    yield put
    worker.runner.drafter = worker.dspark


def _run(worker, requests: list[Request], draft: bool = True) -> tuple[list, Engine]:
    """Each request's last event (its logprobs those of every event, its text all of it), and the engine."""
    config = EngineConfig(max_seqs=16, max_context=512, chunk=32, draft=draft)
    engine = Engine(worker, worker.tokenizer, config)
    engine.start()

    async def go():
        async def last(stream):
            text, logprobs = [], []
            async for event in stream:
                text.append(event.text)
                logprobs.extend(event.logprobs)
                if event.finish:
                    return replace(event, text="".join(text), logprobs=tuple(logprobs))

        return await asyncio.gather(*[last(s) for s in engine.submit(requests)])

    try:
        return asyncio.run(go()), engine
    finally:
        engine.close()


def _requests(**kw) -> list[Request]:
    return [Request(p, s, GEN, logprobs=2, **kw) for p, s in zip(PROMPTS, PARAMS, strict=True)]


def _view(event) -> tuple:
    return token_sha(event.tokens), event.logprobs, event.text, event.finish


@pytest.fixture(scope="module")
def serial(worker):
    """The 16 requests decoded serially (an engine that does not draft)."""
    events, engine = _run(worker, _requests(), draft=False)
    assert engine.draft_stats() == {"on": False, "note": "drafting off: --no-draft", "drafts": 0,
                                    "draft_tokens": 0, "accepted_tokens": 0}  # fmt: skip
    return events


def _metric(engine: Engine, name: str) -> float:
    return engine.metrics.registry.get_sample_value(f"tfc:{name}_total", {"model_name": "model"}) or 0.0


def test_scripted_drafts_give_serial_tokens_solo_and_sixteen_at_once(worker, serial, drafter):
    script = drafter(Scripted([p + e.tokens for p, e in zip(PROMPTS, serial, strict=True)], VOCAB))
    (solo,), _ = _run(worker, _requests()[1:2])  # seeded
    assert _view(solo) == _view(serial[1]) and solo.usage.accepted_tokens > 0
    script.proposed = 0
    events, engine = _run(worker, _requests())
    assert [_view(e) for e in events] == [_view(e) for e in serial]
    stats = engine.draft_stats()
    assert stats["on"] and stats["note"].startswith("drafting on: up to 5 tokens")
    assert 0 < stats["accepted_tokens"] < stats["draft_tokens"] and stats["drafts"] == script.proposed
    for key in ("drafts", "draft_tokens", "accepted_tokens"):
        assert stats[key] == sum(getattr(e.usage, key) for e in events)
    assert _metric(engine, "spec_decode_num_drafts") == stats["drafts"]
    assert _metric(engine, "spec_decode_num_draft_tokens") == stats["draft_tokens"]
    assert _metric(engine, "spec_decode_num_accepted_tokens") == stats["accepted_tokens"]
    assert engine.steps < 16  # rounds that accepted all five of their drafts


def test_dspark_drafts_give_serial_tokens(worker, serial):
    events, engine = _run(worker, _requests()[:4])
    assert [_view(e) for e in events] == [_view(e) for e in serial[:4]]
    assert engine.draft_stats()["draft_tokens"] > 0


def test_stops_and_limits_inside_a_window_end_where_serial_ends(worker, serial, drafter):
    drafter(Scripted([p + e.tokens for p, e in zip(PROMPTS, serial, strict=True)], VOCAB, errors=(None,)))
    tokens = serial[0].tokens
    text = worker.tokenizer.decode(list(tokens), skip_special_tokens=False)
    stop = text[len(text) // 3 : len(text) // 3 + 2]
    asks = [
        Request(PROMPTS[0], GREEDY, GEN, frozenset({tokens[3]}), logprobs=2),  # a stop id in round one
        Request(PROMPTS[0], GREEDY, GEN, stop_strings=(stop,), logprobs=2),
        Request(PROMPTS[0], GREEDY, 3, logprobs=2),  # max_tokens inside the first window
        Request(PROMPTS[1], PARAMS[1], GEN, frozenset({serial[1].tokens[2]}), logprobs=2),
    ]
    drafted, engine = _run(worker, asks)
    plain, _ = _run(worker, [replace(r, draft=False) for r in asks])
    assert [_view(e) for e in drafted] == [_view(e) for e in plain]
    assert [e.finish for e in drafted] == ["stop", "stop", "length", "stop"]
    assert drafted[0].tokens[-1] == tokens[3] and stop not in drafted[1].text
    assert engine.draft_stats()["accepted_tokens"] > 0 and all(e.usage.drafts for e in drafted)
    assert plain[0].usage.drafts == 0


def test_constrained_requests_give_serial_tokens(worker, drafter):
    grammars = Grammars(worker.tokenizer, VOCAB, (1,))
    schema = '{"type": "array", "maxItems": 4, "items": {"type": "boolean"}}'

    def asks(draft: bool) -> list[Request]:
        def constraint():
            return AllOf([grammars.compile(f"start: %json {schema}"), BannedTokens(VOCAB, frozenset({2}))])

        params = (SamplingParams(temperature=1.0, seed=5), GREEDY)
        return [Request(PROMPTS[i], p, 24, frozenset({1}), constraint=constraint(), logprobs=2, draft=draft)
                for i, p in enumerate(params)]  # fmt: skip

    plain, _ = _run(worker, asks(False))
    drafter(Scripted([p + e.tokens for p, e in zip(PROMPTS, plain, strict=False)], VOCAB, errors=(None, 1)))
    drafted, engine = _run(worker, asks(True))
    assert [_view(e) for e in drafted] == [_view(e) for e in plain]
    assert drafted[0].text.startswith("[") and engine.draft_stats()["accepted_tokens"] > 0


def test_generate_drafted_equals_serial_solo_and_sixteen_at_once(worker, drafter):
    plain = generate(worker, PROMPTS, GEN, PARAMS, keep_logits=True, draft=False)
    script = drafter(Scripted([p + tuple(g.tokens) for p, g in zip(PROMPTS, plain, strict=True)], VOCAB))
    (solo,) = generate(worker, PROMPTS[1:2], GEN, PARAMS[1:2], keep_logits=True)
    # room for every stream's 5 drafts (by default 16 streams fill the step and draft none: test_draft_share.py)
    drafted = generate(worker, PROMPTS, GEN, PARAMS, keep_logits=True, draft_rows=16 * 6)
    for got, want in zip([solo, *drafted], [plain[1], *plain], strict=True):
        assert got.token_sha == want.token_sha
        assert all(torch.equal(a, b) for a, b in zip(got.logits, want.logits, strict=True))
    assert script.proposed and sum(g.drafted.accepted_tokens for g in drafted) > 0
    assert all(g.drafted.drafts == 0 for g in plain)


def test_tfc_generate_drafts_by_default_and_no_draft_gives_the_same_tokens(tiny_image):
    import json

    from click.testing import CliRunner

    from tfc.cli import cli

    def run(*flags: str) -> dict:
        args = ["generate", tiny_image, "--json", "--device", "cpu", "--prompt", "Hello", "--max-tokens", "8"]
        result = CliRunner().invoke(cli, [*args, "--temperature", "0.8", "--seed", "3", *flags])
        assert result.exit_code == 0, result.output
        return json.loads(result.output.strip().splitlines()[-1])

    drafted, serial = run(), run("--no-draft")
    assert drafted["tokens"] == serial["tokens"] and drafted["token_sha"] == serial["token_sha"]
    assert drafted["drafting"]["on"] and drafted["drafting"]["drafts"] > 0
    assert serial["drafting"] == {"on": False, "note": "--no-draft", "drafts": 0, "draft_tokens": 0,
                                  "accepted_tokens": 0}  # fmt: skip
