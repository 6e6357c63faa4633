"""A Responses body translated into its chat completion body, and chat refusals named in Responses terms."""

from __future__ import annotations

import pytest
from tfc.runtime.server.admission import BadRequest
from tfc.runtime.server.responses_input import translate
from tfc.runtime.server.responses_protocol import ResponsesRequest

CALL = {"type": "function_call", "name": "f", "arguments": "{}"}


def _messages(**body) -> list[dict]:
    t = translate(ResponsesRequest(**body))
    return [m.model_dump(exclude_none=True) for m in t.chat.messages]


def test_one_reply_s_items_make_one_assistant_turn():
    items = [
        {"role": "user", "content": "q"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "hm"}],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
        {**CALL, "call_id": "c1"},
        {**CALL, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "2"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
        {**CALL, "call_id": "c3"},
        {"type": "function_call_output", "call_id": "c3", "output": "3"},
    ]
    msgs = _messages(input=items, instructions="be brief")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "tool", "assistant", "tool"]
    first = msgs[2]
    assert first["reasoning_content"] == "hm" and first["content"] == [{"type": "text", "text": "a"}]
    assert [c["id"] for c in first["tool_calls"]] == ["c1", "c2"]
    assert msgs[4] == {"role": "tool", "tool_call_id": "c2", "content": "2"}
    assert msgs[5]["reasoning_content"] == "s" and [c["id"] for c in msgs[5]["tool_calls"]] == ["c3"]


def test_a_second_assistant_message_is_a_turn_of_its_own():
    items = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "r"},
    ]
    assert [m.get("content") for m in _messages(input=items)] == ["q", "a", "b", "r"]


def test_chat_field_names_become_the_request_s_own():
    items = [
        {"role": "user", "content": "q"},
        {**CALL, "call_id": "c1"},
        {**CALL, "call_id": "c2"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"},
    ]
    t = translate(ResponsesRequest(input=items, instructions="i"))
    # messages: 0 instructions, 1 input[0], 2 the assistant turn of input[1] and input[2], 3 input[3]
    assert t.rename(
        "messages[2].tool_calls[1].function.arguments",
        "messages[2].tool_calls[1].function.arguments: not JSON",
    ) == ("input[2].arguments", "input[2].arguments: not JSON")
    assert t.rename("messages[0].content", "x")[0] == "instructions"
    assert t.rename("messages[3]", "x")[0] == "input[3]"
    assert t.rename("messages", "x")[0] == "input"
    assert t.rename("reasoning_effort", "reasoning_effort: bad") == (
        "reasoning.effort",
        "reasoning.effort: bad",
    )
    assert t.rename("tools[1].function.name", "x")[0] == "tools[1].name"
    assert t.rename("response_format.json_schema.schema", "x")[0] == "text.format.schema"
    assert t.rename("tool_choice.function.name", "x")[0] == "tool_choice.name"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"input": [{"type": "reasoning", "encrypted_content": "x"}, {"role": "user", "content": "r"}]},
            "input[0].encrypted_content",
        ),
        ({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}, "input[0].content[0].text"),
        ({"input": [{"role": "user", "content": 3}]}, "input[0].content"),
        ({"input": [3]}, "input[0]"),
        ({"input": "q", "tools": [{"type": "function", "name": "f", "extra": 1}]}, "tools[0].extra"),
        ({"input": "q", "tool_choice": {"type": "function", "name": "f", "x": 1}}, "tool_choice.x"),
        ({"input": "q", "tool_choice": "sometimes"}, "tool_choice"),
        ({"input": "q", "text": {"format": {"type": "json_object", "schema": {}}}}, "text.format.schema"),
    ],
)
def test_translation_refusals_name_the_item_and_field(body, param):
    with pytest.raises(BadRequest) as caught:
        translate(ResponsesRequest(**body))
    assert caught.value.param == param and caught.value.message
