"""`POST /v1/responses` through the official openai client: a Responses request runs as its chat completion.

The tiny model is random, so its text is noise: the tests hold the route to the chat route it translates
onto (same prompt ids, same tokens by `token_sha`), to its own streamed events (the same text joined), to
the constraints (a schema, a calls block) and to its refusals, each naming the field.
"""

from __future__ import annotations

import http.client
import json
import signal
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.chat_schemas import SCHEMAS, WEATHER, valid
from support.server import ServerProcess

PING = {"type": "function", "name": "ping", "parameters": {"type": "object", "properties": {}}}
WEATHER_FN = {"type": "function", **WEATHER["function"]}  # the same tool in the Responses shape
QUESTION = "What is the weather in Paris?"
SMALL = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "color": {"enum": ["red", "blue"]}},
    "required": ["ok", "color"],
    "additionalProperties": False,
}


@pytest.fixture
def client(server):
    """The official client with room for the long prompts a tools section makes on a loaded 2-core machine."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def _sha(reply) -> str:
    return reply.model_extra["token_sha"] if reply.model_extra else reply.token_sha


def _schema_text(schema: dict) -> dict:
    return {"format": {"type": "json_schema", "name": "out", "schema": schema, "strict": True}}


def test_string_input_runs_as_its_chat_completion(client):
    r = client.responses.create(
        model="tiny",
        input="Hello there",
        instructions="Be brief",
        max_output_tokens=8,
        temperature=0,
        metadata={"run": "a"},
        user="u1",
        safety_identifier="s1",
    )
    c = client.chat.completions.create(
        model="tiny",
        max_tokens=8,
        temperature=0,
        messages=[{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hello there"}],
    )
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny" and r.created_at > 0
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (msg,) = r.output
    assert msg.type == "message" and msg.role == "assistant" and msg.status == "incomplete"
    assert msg.id.startswith("msg_") and [p.type for p in msg.content] == ["output_text"]
    assert r.output_text == c.choices[0].message.content and _sha(r) == c.token_sha
    u = r.usage
    assert (u.input_tokens, u.output_tokens) == (c.usage.prompt_tokens, 8)
    assert u.total_tokens == u.input_tokens + 8 and u.output_tokens_details.reasoning_tokens == 0
    assert r.store is False and r.instructions == "Be brief" and r.max_output_tokens == 8
    assert r.metadata == {"run": "a"} and r.user == "u1" and r.safety_identifier == "s1"
    assert r.previous_response_id is None


@pytest.mark.slow
def test_item_input_runs_as_the_same_messages(client):
    items = [
        {"role": "developer", "content": "Answer in French."},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "Hi"}, {"type": "input_text", "text": "there"}],
        },
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Bonjour", "annotations": []}],
        },
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "And now?"},
    ]
    msgs = [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
        {"role": "assistant", "content": "Bonjour"},
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "And now?"},
    ]
    r = client.responses.create(
        model="tiny", input=items, max_output_tokens=6, temperature=0.8, extra_body={"seed": 5}
    )
    c = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6, temperature=0.8, seed=5)
    assert _sha(r) == c.token_sha and r.usage.input_tokens == c.usage.prompt_tokens
    assert r.output_text == c.choices[0].message.content


@pytest.mark.slow
def test_streamed_events_come_in_order_and_join_into_the_reply(client, server):
    kw = {"model": "tiny", "input": "Tell me a story", "max_output_tokens": 8, "temperature": 0}
    whole = client.responses.create(**kw)
    events = list(client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert events[0].response.status == "in_progress" and events[0].response.id == events[-1].response.id
    text = "".join(d.delta for d in deltas)
    assert text == whole.output_text == events[-4].text == events[-2].item.content[0].text
    final = events[-1].response
    assert final.output_text == text and final.status == "incomplete" and _sha(final) == _sha(whole)
    assert final.usage.output_tokens == 8 and final.incomplete_details.reason == "max_output_tokens"
    assert len({d.item_id for d in deltas} | {events[2].item.id}) == 1
    # the raw frames name their type twice: `event:` and the data's `type`
    req = urllib.request.Request(
        server.url + "/v1/responses",
        json.dumps({**kw, "stream": True}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as reply:
        frames = [f for f in reply.read().decode().split("\n\n") if f.startswith("event:")]
    for f in frames:
        head, data = f.split("\n", 1)
        assert head == "event: " + json.loads(data.removeprefix("data: "))["type"]
    assert len(frames) == len(events)


@pytest.mark.slow
def test_text_format_json_schema_holds_and_streams_the_same(client):
    kw = {
        "model": "tiny",
        "input": QUESTION,
        "max_output_tokens": 60,
        "temperature": 1.0,
        "text": _schema_text(SMALL),
        "extra_body": {"seed": 7, "draft": False},
    }
    with ThreadPoolExecutor(4) as pool:  # side by side: one batch's steps, not four
        loose = pool.submit(
            client.responses.create,
            model="tiny",
            input=QUESTION,
            max_output_tokens=40,
            temperature=1.0,
            text={"format": {"type": "json_object"}},
            extra_body={"seed": 2},
        )
        other = pool.submit(client.responses.create, **{**kw, "text": _schema_text(SCHEMAS[2])})
        streamed = pool.submit(lambda: _stream_final(client, kw))
        whole = client.responses.create(**kw)
    assert whole.status == "completed" and valid(json.loads(whole.output_text), SMALL), whole.output_text
    assert whole.text.format.type == "json_schema"
    final, joined = streamed.result()
    assert final.output_text == joined == whole.output_text and _sha(final) == _sha(whole)
    r = other.result()
    assert r.status == "completed" and valid(json.loads(r.output_text), SCHEMAS[2])
    text = loose.result().output_text
    assert text.startswith("{") and (
        loose.result().status == "incomplete" or isinstance(json.loads(text), dict)
    )


def _stream_final(client, kw: dict):
    """(the final response, the joined text deltas) of `client.responses.stream`."""
    with client.responses.stream(**kw) as stream:
        joined = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        return stream.get_final_response(), joined


@pytest.mark.slow
def test_reasoning_comes_back_as_a_reasoning_item(client):
    kw = {"model": "tiny", "input": QUESTION, "max_output_tokens": 6, "temperature": 0}
    with ThreadPoolExecutor(3) as pool:
        streamed = pool.submit(
            lambda: list(client.responses.create(stream=True, reasoning={"effort": "low"}, **kw))
        )
        chat = pool.submit(
            client.chat.completions.create,
            model="tiny",
            max_tokens=6,
            temperature=0,
            messages=[{"role": "user", "content": QUESTION}],
            reasoning_effort="low",
        )
        off = pool.submit(client.responses.create, reasoning={"effort": "none"}, **kw)
        r = client.responses.create(reasoning={"effort": "low", "summary": "auto"}, **kw)
    (item,) = r.output
    assert item.type == "reasoning" and item.id.startswith("rs_") and item.status == "incomplete"
    assert item.summary == [] and [p.type for p in item.content] == ["reasoning_text"]
    c = chat.result()
    assert item.content[0].text == c.choices[0].message.reasoning_content and _sha(r) == c.token_sha
    assert r.usage.output_tokens_details.reasoning_tokens == r.usage.output_tokens == 6
    assert r.status == "incomplete" and r.output_text == "" and r.reasoning.effort == "low"
    events = streamed.result()
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert deltas == item.content[0].text
    assert [e.text for e in events if e.type == "response.reasoning_text.done"] == [deltas]
    assert all(o.type == "message" for o in off.result().output)


@pytest.mark.slow
def test_function_tools_and_tool_choice(client):
    kw = {
        "model": "tiny",
        "input": QUESTION,
        "tools": [WEATHER_FN, PING],
        "max_output_tokens": 96,
        "temperature": 1.0,
    }
    named = {
        **kw,
        "tool_choice": {"type": "function", "name": "get_weather"},
        "extra_body": {"seed": 1, "draft": False},
    }
    whole = client.responses.create(**named)
    with ThreadPoolExecutor(
        3
    ) as pool:  # one batch, each resuming the same tools prompt from the prefix cache
        required = pool.submit(
            client.responses.create, tool_choice="required", extra_body={"seed": 4, "draft": False}, **kw
        )
        streamed = pool.submit(lambda: list(client.responses.create(stream=True, **named)))
        none = pool.submit(client.responses.create, **{**kw, "max_output_tokens": 16, "tool_choice": "none"})
    r = required.result()
    assert r.status == "completed" and r.output and all(o.type == "function_call" for o in r.output), r.output
    fns = {t["name"]: t for t in (WEATHER_FN, PING)}
    for call in r.output:
        assert call.call_id.startswith("call_") and call.id.startswith("fc_") and call.status == "completed"
        assert valid(json.loads(call.arguments), fns[call.name]["parameters"])
    (call,) = whole.output
    assert call.name == "get_weather" and valid(json.loads(call.arguments), WEATHER_FN["parameters"])
    events = streamed.result()
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert [a.type for a in added] == ["function_call"] and added[0].name == "get_weather"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert args == call.arguments == done[0].arguments and events[-1].type == "response.completed"
    assert _sha(events[-1].response) == _sha(whole)
    n = none.result()
    assert all(o.type == "message" for o in n.output) and "｜DSML｜" not in n.output_text
    # the stateless round trip: the reply's own items sent back with the call's output
    turn = [
        {"role": "user", "content": QUESTION},
        *whole.output,
        {"type": "function_call_output", "call_id": call.call_id, "output": '{"sunny": true}'},
    ]
    after = client.responses.create(model="tiny", input=turn, tools=[WEATHER_FN, PING], max_output_tokens=2)
    assert after.usage.input_tokens > whole.usage.input_tokens + whole.usage.output_tokens


@pytest.mark.slow
def test_a_function_call_output_turn_renders_as_the_chat_round_trip(client, server):
    items = [
        {"role": "user", "content": QUESTION},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_1", "output": '{"sunny": true}'},
    ]
    msgs = [
        {"role": "user", "content": QUESTION},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sunny": true}'},
    ]
    r = client.responses.create(
        model="tiny", input=items, tools=[WEATHER_FN], max_output_tokens=2, temperature=0
    )
    status, body, _ = server.request("POST", "/tokenize", {"messages": msgs, "tools": [WEATHER]})
    assert status == 200 and body["count"] == r.usage.input_tokens
    assert r.usage.input_tokens_details.cached_tokens >= 0


@pytest.mark.slow
def test_concurrent_equals_solo(server):
    bodies = [
        {"input": "Hello", "max_output_tokens": 12, "temperature": 0.9, "seed": 1},
        {
            "input": [{"role": "user", "content": "Hi"}],
            "instructions": "Be kind",
            "max_output_tokens": 12,
            "temperature": 0.9,
            "seed": 2,
        },
        {
            "input": QUESTION,
            "reasoning": {"effort": "high"},
            "max_output_tokens": 12,
            "temperature": 0.9,
            "seed": 3,
        },
        {
            "input": QUESTION,
            "text": _schema_text(SMALL),
            "max_output_tokens": 24,
            "temperature": 0.9,
            "seed": 4,
        },
    ]

    def post(body):
        status, reply, _ = server.request("POST", "/v1/responses", {"model": "tiny", **body}, timeout=600)
        assert status == 200, reply
        return reply["token_sha"]

    solo = [post(b) for b in bodies]
    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(post, bodies))
    assert together == solo


def test_previous_response_id_is_refused_and_nothing_is_stored(client, server):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(model="tiny", input="Hi", previous_response_id="resp_123")
    error = caught.value.body
    assert error["param"] == "previous_response_id" and "stateless" in error["message"]
    for method in ("GET", "DELETE"):
        status, body, _ = server.request(method, "/v1/responses/resp_123")
        assert status == 404 and "does not store" in body["error"]["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "frequency": 1}, "frequency"),
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"role": "user", "content": "x", "name": "bob"}]}, "input[0].name"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "input[0].call_id"),
        ({"input": ["Hi", {"role": "assistant", "content": "x"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, "input[1]"),
        (
            {
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"},
                    {"type": "function_call_output", "call_id": "c", "output": "1"},
                ]
            },
            "input[1].arguments",
        ),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"input": "x", "tools": [{"type": "function", "name": "a b <c>"}]}, "tools[0].name"),
        (
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": 3}]},
            "tools[0].parameters",
        ),
        ({"input": "x", "tool_choice": "required"}, "tool_choice"),
        (
            {"input": "x", "tools": [PING], "tool_choice": {"type": "function", "name": "nope"}},
            "tool_choice.name",
        ),
        ({"input": "x", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
        ({"input": "x", "reasoning": {"effort": "low", "mode": "x"}}, "reasoning.mode"),
        ({"input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"input": "x", "text": _schema_text({"type": "string", "format": "bogus"})}, "text.format"),
        ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "x", "background": True}, "background"),
        ({"input": "x", "include": ["message.output_text.logprobs"]}, "include[0]"),
        ({"input": "x", "model": "other"}, "model"),
    ],
)
def test_refusals_name_the_field(server, body, param):
    status, reply, _ = server.request("POST", "/v1/responses", {"max_output_tokens": 2, **body})
    assert status in (400, 404) and reply["error"]["param"] == param, reply
    assert (
        reply["error"]["type"] in ("invalid_request_error", "not_found_error") and reply["error"]["message"]
    )


@pytest.mark.slow
def test_a_drain_refuses_new_responses_and_fails_a_stream_at_its_deadline(served_image, tmp_path):
    long = {"model": "tiny", "input": "Hello", "max_output_tokens": 3000, "temperature": 0, "stream": True}
    with ServerProcess(served_image, "--model-name", "tiny", "--drain-s", "1.5", log=tmp_path / "log") as s:
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        conn.request("POST", "/v1/responses", json.dumps(long), {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and r.readline() == b"event: response.created\n"
        s.signal(signal.SIGTERM)
        time.sleep(0.3)
        status, reply, headers = s.request("POST", "/v1/responses", {**long, "stream": False})
        assert (
            status == 503 and headers["retry-after"] == "30" and reply["error"]["code"] == "server_restarting"
        )
        frames = [f for f in r.read().decode().split("\n\n") if f.startswith("event:")]
        conn.close()
        error, failed = (json.loads(f.split("\ndata: ", 1)[1]) for f in frames[-2:])
        assert error["type"] == "error" and "drain deadline" in error["message"]
        assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
        assert failed["sequence_number"] == error["sequence_number"] + 1
        assert all(item["status"] == "incomplete" for item in failed["response"]["output"])
        assert s.proc.wait(20) == 0
