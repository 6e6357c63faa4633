"""min_tokens: no stop id is drawn and no stop string ends a sequence before that many generated tokens."""

from __future__ import annotations

import random

import pytest
from test_detok import WholeReply, _reply, _run
from test_engine_sampling_hooks import PROMPT, VOCAB, run
from tfc.fixtures.tokenizer import build_tokenizer
from tfc.runtime.engine.constraint import BannedTokens
from tfc.runtime.engine.detok import StopText, stop_prefix
from tfc.runtime.engine.engine import Engine, EngineConfig
from tfc.runtime.engine.request import Rejected, Request
from tfc.runtime.engine.sampling import SamplingParams
from tfc.runtime.models.dsv41.chat.reply import ReplyIds, ReplyReader

EOS = 1  # the fake runner's end of sequence


class HeldReply(WholeReply):
    """The whole-reply reference, its stop strings looked for only once more than `min_tokens` ids came."""

    def __init__(self, tokenizer, stops, min_tokens: int) -> None:
        super().__init__(tokenizer, stops)
        self.min_tokens = min_tokens

    def add(self, token):
        if token is not None:
            self.ids.append(token)
            self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        text = self.text
        for stop in self.stops if len(self.ids) > self.min_tokens else ():
            at = text.find(stop, max(0, self.released - len(stop) + 1))
            if at >= 0:
                return self._release(text[:at], at), True
        hold = max(1 if text.endswith("\ufffd") else 0, stop_prefix(text, self.stops))
        return self._release(text, len(text) - hold), False


def test_stop_text_holds_stop_strings_until_min_tokens():
    tok, rng = build_tokenizer(VOCAB), random.Random(11)
    for trial in range(80):
        ids = _reply(tok, rng, rng.randint(1, 60))
        text = tok.decode(ids, skip_special_tokens=True)
        stops = [text[at : at + rng.randint(1, 4)] for at in (rng.randrange(max(1, len(text))) for _ in "ab")]
        least, cut = rng.randint(0, len(ids)), rng.random() < 0.5
        got = _run(StopText(tok, stops, least), ids, cut)
        assert got == _run(HeldReply(tok, stops, least), ids, cut), (trial, ids, stops, least)
        assert all(not hit for _, hit in got[:least]), (trial, least)


def test_the_chat_reply_reader_holds_stop_strings_until_min_tokens():
    tok = build_tokenizer(VOCAB)
    text = "the answer STOP and more STOP end"
    ids = tok.encode(text, add_special_tokens=False).ids
    done_at = [next(k for k in range(1, len(ids) + 1) if len(tok.decode(ids[:k])) >= at + 4)
               for at in (text.index("STOP"), text.rindex("STOP"))]  # fmt: skip
    for least in range(len(ids) + 1):
        reader = ReplyReader(
            tok, ReplyIds(-1, -1), thinking=False, tools=False, stops=("STOP",), min_tokens=least
        )
        parts, hit = [], False
        for token in ids:
            got, hit = reader.add(token)
            parts += got
            if hit:
                break
        parts += [] if hit else reader.flush()
        ends = [
            at for at, k in zip((text.index("STOP"), text.rindex("STOP")), done_at, strict=True) if k > least
        ]
        assert "".join(p.text for p in parts if hasattr(p, "text")) == text[: ends[0] if ends else None], (
            least
        )
        assert hit == bool(ends)


def test_min_tokens_holds_a_forced_eos_off_exactly_that_long():
    forced = SamplingParams(logit_bias=((EOS, 100.0),))
    alone = run([Request(PROMPT, forced, 12, frozenset({EOS}))])[0]
    assert alone[-1].tokens == (EOS,)
    for least in (1, 5, 11):
        last = run([Request(PROMPT, forced, 12, frozenset({EOS}), min_tokens=least)])[0][-1]
        assert last.finish == "stop" and len(last.tokens) == least + 1 and EOS not in last.tokens[:least]
    sampled = [Request(PROMPT, SamplingParams(temperature=1.0, seed=s, logit_bias=((EOS, 6.0),)), 12,
                       frozenset({EOS}), min_tokens=7) for s in range(4)]  # fmt: skip
    for events in run(sampled):
        assert len(events[-1].tokens) > 7 and EOS not in events[-1].tokens[:7]


def test_a_constraint_that_allows_only_a_stop_still_ends_the_sequence():
    only_eos = BannedTokens(VOCAB, frozenset(range(VOCAB)) - {EOS})
    last = run([Request(PROMPT, SamplingParams(), 8, frozenset({EOS}), constraint=only_eos, min_tokens=4)])[
        0
    ][-1]
    assert last.tokens == (EOS,) and last.finish == "stop"


def test_min_tokens_past_max_tokens_is_refused_naming_it():
    from test_engine_sampling_hooks import FakeRunner

    engine = Engine(FakeRunner(), build_tokenizer(VOCAB), EngineConfig(max_seqs=4, max_context=512))
    with pytest.raises(Rejected) as caught:
        engine.check(Request(PROMPT, SamplingParams(), 4, min_tokens=5))
    assert caught.value.status == 400 and caught.value.param == "min_tokens"
