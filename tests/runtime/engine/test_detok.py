"""StopText decodes a bounded window per token and releases exactly what a whole-reply decode would."""

from __future__ import annotations

import random

import pytest
from support.tokenizers import write_tokenizer
from support.v41_tokenizer import v41_tokenizer
from tfc.runtime.engine import detok
from tfc.runtime.engine.detok import StopText, stop_prefix


class WholeReply:
    """The reference: the whole reply decoded again on every token (StopText's semantics, at quadratic cost)."""

    def __init__(self, tokenizer, stops) -> None:
        self.tokenizer, self.stops = tokenizer, tuple(s for s in stops if s)
        self.ids, self.released, self.text = [], 0, ""

    def add(self, token):
        if token is not None:
            self.ids.append(token)
            self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        text = self.text
        for stop in self.stops:
            at = text.find(stop, max(0, self.released - len(stop) + 1))
            if at >= 0:
                return self._release(text[:at], at), True
        hold = max(1 if text.endswith("\ufffd") else 0, stop_prefix(text, self.stops))
        return self._release(text, len(text) - hold), False

    def flush(self, cut=False):
        return self._release(self.text, len(self.text))

    def _release(self, text, upto):
        upto = max(upto, self.released)
        out, self.released = text[self.released : upto], upto
        return out


class Counting:
    """A tokenizer that counts the ids it is asked to decode."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.calls, self.ids, self.widest = tokenizer, 0, 0, 0

    def decode(self, ids, skip_special_tokens=True):
        self.calls, self.ids, self.widest = self.calls + 1, self.ids + len(ids), max(self.widest, len(ids))
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


PARTIAL_IDS: dict[str, int] = {}  # the partial tokenizer's ids by name, once the fixture wrote it


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    """The test tokenizers: the tiny pack's byte-level BPE, the partial-byte one, the real V4.1 one if installed."""
    from tfc.fixtures.tokenizer import build_tokenizer
    from tokenizers import Tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    PARTIAL_IDS.update(write_tokenizer(path))
    found = {"fixture": build_tokenizer(640), "partial": Tokenizer.from_file(str(path))}
    real = v41_tokenizer()
    if real is not None:
        found["v41"] = real
    return found


TEXTS = ["The weather in Paris is sunny, about 21 °C.", "naïve café — ﬁn", "€ 42 💡 ok", "日本語のテキスト",
         "def f(x):\n    return x", "emoji 😀😃 and ü̊ marks"]  # fmt: skip


def _reply(tok, rng: random.Random, n: int) -> list[int]:
    """`n` ids: encoded texts with multi-byte characters, and random ids (partial bytes, specials) between."""
    ids: list[int] = []
    vocab = tok.get_vocab_size()
    while len(ids) < n:
        if rng.random() < 0.6:
            ids += tok.encode(rng.choice(TEXTS), add_special_tokens=False).ids
        else:
            ids += [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
    return ids[:n]


def _run(reader, ids: list[int], cut: bool) -> list[tuple[str, bool]]:
    out = []
    for token in ids:
        text, hit = reader.add(token)
        out.append((text, hit))
        if hit:
            return out
    out.append((reader.flush(cut=cut), False))
    out.append(reader.add(None))
    return out


@pytest.fixture(params=["trim as set", "trim at once"])
def trim(request, monkeypatch):
    """StopText as it is, and dropping released text as soon as no stop string can reach it."""
    if request.param == "trim at once":
        monkeypatch.setattr(detok, "TRIM", 0)


@pytest.mark.usefixtures("trim")
def test_stop_text_releases_what_a_whole_reply_decode_releases(tokenizers):
    rng = random.Random(7)
    for name, tok in tokenizers.items():
        for trial in range(60):
            ids = _reply(tok, rng, 700 if trial % 10 == 0 else rng.randint(1, 120))  # long ones trim
            text = tok.decode(ids, skip_special_tokens=True)
            stops = []
            for _ in range(rng.randint(0, 3)):  # stop strings cut out of the reply span tokens
                at = rng.randrange(max(1, len(text)))
                stops.append(text[at : at + rng.randint(1, 6)])
            stops += rng.sample(["\ufffd", "e", " the", "x\ny", "😀"], rng.randint(0, 2))
            cut = rng.random() < 0.5
            got, want = _run(StopText(tok, stops), ids, cut), _run(WholeReply(tok, stops), ids, cut)
            assert got == want, (name, trial, ids, stops)
            assert not any(s and s in "".join(t for t, _ in got) for s in stops)  # never shown whole


def _byte_ids(tok) -> list[int]:
    """The id of each single byte in a GPT-2 byte-level vocabulary."""
    keep = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    extra, ids = 0, []
    for b in range(256):
        ids.append(tok.token_to_id(chr(b) if b in keep else chr(256 + extra)))
        extra += b not in keep
    return ids


@pytest.mark.usefixtures("trim")
def test_byte_by_byte_replies_with_broken_and_long_unfinished_characters(tokenizers):
    """One id per byte: whole, cut and lone pieces of multi-byte characters, literal U+FFFD, skipped specials."""
    tok = tokenizers["fixture"]
    byte = _byte_ids(tok)
    chars = [c.encode() for c in "aé€😀日ü̊\ufffd"]
    rng = random.Random(11)
    for trial in range(300):
        data: list[int] = []
        n = rng.randint(1, 160)
        while len(data) < n:
            kind = rng.random()
            if kind < 0.4:
                data += [byte[b] for b in rng.choice(chars)]
            elif kind < 0.7:  # a character cut short, or a lone byte
                raw = rng.choice(chars)
                data += [byte[b] for b in raw[: rng.randint(1, max(1, len(raw) - 1))]]
            elif kind < 0.85:
                data.append(byte[rng.randrange(0x80, 0x100)])
            else:
                data += [tok.token_to_id("<｜▁pad▁｜>")] * rng.randint(1, 12)
        stops = rng.sample(["\ufffd", "€", "a\ufffd", "é😀", "日日", "a€", "aaé"], rng.randint(0, 2))
        cut = rng.random() < 0.5
        got, want = _run(StopText(tok, stops), data, cut), _run(WholeReply(tok, stops), data, cut)
        assert got == want, (trial, data, stops)


def test_a_split_multibyte_character_is_never_released_in_halves(tokenizers):
    tok = tokenizers["fixture"]
    ids = tok.encode("a€b😀c", add_special_tokens=False).ids
    st = StopText(tok, [])
    pieces = [st.add(t)[0] for t in ids] + [st.flush()]
    assert "".join(pieces) == "a€b😀c" and not any("\ufffd" in p for p in pieces)
    assert len(ids) > 5  # the byte-level pieces split the characters across ids


@pytest.mark.parametrize("kind", ["text", "partial characters", "skipped specials"])
def test_decode_cost_per_token_is_bounded_over_a_long_reply(tokenizers, kind):
    rng = random.Random(3)
    tok = tokenizers["partial" if kind == "partial characters" else "fixture"]
    if kind == "text":
        ids = []
        while len(ids) < 2000:
            ids += tok.encode(rng.choice(TEXTS), add_special_tokens=False).ids
    elif kind == "partial characters":  # lone lead bytes and literal U+FFFD: every decode ends in U+FFFD
        ids = [rng.choice([PARTIAL_IDS["partial_c3"], PARTIAL_IDS["partial_e2"], PARTIAL_IDS["replacement"]])
               for _ in range(2000)]  # fmt: skip
    else:  # ids that show nothing, then text
        ids = [tok.token_to_id("<｜▁pad▁｜>")] * 1000 + tok.encode("a é", add_special_tokens=False).ids * 400
    counting = Counting(tok)
    st = StopText(counting, ["zz", "):\n    q"])
    released = "".join(st.add(t)[0] for t in ids) + st.flush(cut=True)
    assert released == tok.decode(ids, skip_special_tokens=True)
    assert counting.widest <= 16 and counting.ids <= 20 * len(ids), (counting.widest, counting.ids, len(ids))
