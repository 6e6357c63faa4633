"""The V4.1 grammars: random walks through them always read back as well-formed calls or schema JSON."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from tfc.fixtures.tokenizer import build_tokenizer
from tfc.runtime.engine.chat import CallArguments, CallStart, Content, ReplyEnd
from tfc.runtime.engine.grammar import Grammars
from tfc.runtime.models.dsv41.chat.grammar import json_grammar, tool_grammar
from tfc.runtime.models.dsv41.chat.reply import ReplyIds, ReplyReader

FUNCTIONS = [
    {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]}, "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "note": {"type": "string", "maxLength": 3}, "metric": {"type": "boolean"}}, "required": ["city", "metric"]}},
    {"name": "ping", "parameters": {"type": "object", "properties": {}}},
    {"name": "tag", "parameters": {"type": "object", "properties": {"tags": {"type": "array", "maxItems": 2,
                                                                             "items": {"type": "integer"}}}}},
]  # fmt: skip


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer(640)


def walk(tok, lark: str, seed: int, limit: int = 400) -> list[int]:
    """A random model under the grammar: a uniformly random allowed token each step, EOS half the time it may."""
    c = Grammars(tok, 640, (1,)).compile(lark)
    rng, out = random.Random(seed), []
    for _ in range(limit):
        allowed = np.flatnonzero(c.allowed().numpy())
        token = 1 if 1 in allowed and rng.random() < 0.5 else int(rng.choice(allowed))
        if token == 1:
            return out
        c.advance(token)
        out.append(token)
    raise AssertionError("the walk did not end")


def read(tok, ids: list[int], thinking: bool) -> list:
    reader = ReplyReader(tok, ReplyIds(637, 638), thinking=thinking, tools=True)
    parts = []
    for t in ids:
        parts += reader.add(t)[0]
    return parts + reader.flush()


@pytest.mark.parametrize(("thinking", "parallel"), [(False, True), (False, False), (True, True)])
def test_required_calls_always_parse_with_schema_arguments(tok, thinking, parallel):
    lark = tool_grammar(FUNCTIONS, 638, 637 if thinking else None, parallel)
    names = set()
    for seed in range(12):
        parts = read(tok, walk(tok, lark, seed, limit=2000 if thinking else 400), thinking)
        starts = [p for p in parts if isinstance(p, CallStart)]
        assert starts and (parallel or len(starts) == 1)
        assert not "".join(p.text for p in parts if isinstance(p, Content))
        for s in starts:
            args = json.loads(
                "".join(p.text for p in parts if isinstance(p, CallArguments) and p.index == s.index)
            )
            names.add(s.name)
            if s.name == "get_weather":
                assert args["city"] in ("Paris", "Oslo") and isinstance(args["metric"], bool)
                assert 1 <= args.get("days", 1) <= 14 and len(args.get("note", "")) <= 3
            elif s.name == "ping":
                assert args == {}
        end = parts[-1]
        assert isinstance(end, ReplyEnd) and end.calls == len(starts) and not end.in_reasoning
    assert names == {"get_weather", "ping", "tag"}


def test_a_named_function_is_the_only_call(tok):
    lark = tool_grammar([FUNCTIONS[1]], 638, None, parallel=False)
    for seed in range(4):
        starts = [p for p in read(tok, walk(tok, lark, seed), False) if isinstance(p, CallStart)]
        assert [s.name for s in starts] == ["ping"]


def test_json_after_reasoning(tok):
    schema = {
        "type": "object",
        "properties": {"a": {"enum": [1, 2]}},
        "required": ["a"],
        "additionalProperties": False,
    }
    for seed in range(3):
        ids = walk(tok, json_grammar(schema, 637), seed, limit=3000)
        assert 637 in ids
        content = "".join(p.text for p in read(tok, ids, True) if isinstance(p, Content))
        assert json.loads(content)["a"] in (1, 2)
