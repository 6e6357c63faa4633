"""Anthropic's Messages API on `tfc serve`, through the official anthropic client: shape, tools, thinking,
stops, streaming, count_tokens, keys, refusals.

The tiny model is random, so its text is noise: these tests check structure, determinism and that a Messages
body runs the very chat completion it translates to (the same token ids, by `token_sha`).
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.server import ServerProcess

anthropic = pytest.importorskip("anthropic")

KEY = "k-messages"  # the keyed server's
HELLO = [{"role": "user", "content": "Hello"}]
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Weather of a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]}},
    "required": ["city"]}}  # fmt: skip
PING = {"name": "ping", "input_schema": {"type": "object", "properties": {}}}
TOOLS = [WEATHER, PING]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture
def client(server):
    """The official anthropic client on the shared server (no keys there; see the keyed server's test)."""
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=600)


def post(server, path: str, body: dict | bytes) -> tuple[int, dict, dict]:
    return server.request("POST", path, body, timeout=600)


def raw_events(server, body: dict) -> list[tuple[str, dict]]:
    """A streamed reply's (event, data) pairs, pings included, read off the wire."""
    import urllib.request

    req = urllib.request.Request(server.url + "/v1/messages", json.dumps({**body, "stream": True}).encode(),
                                 {"content-type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(req, timeout=600) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
        frames = r.read().decode().split("\n\n")
    out = []
    for frame in filter(None, frames):
        name, data = frame.split("\n", 1)
        assert name.startswith("event: ") and data.startswith("data: ")
        out.append((name[7:], json.loads(data[6:])))
    return out


def blocks(content: list) -> list[dict]:
    """Content blocks as plain dicts (a streamed message's blocks are the client's Parsed* kinds)."""
    return [b.model_dump(exclude_none=True) for b in content]


def count(client, **kw) -> int:
    return client.messages.count_tokens(model="tiny", **kw).input_tokens


def test_a_plain_message_has_anthropics_shape(client):
    r = client.messages.create(model="tiny", max_tokens=8, messages=HELLO, extra_body=GREEDY)
    assert r.type == "message" and r.role == "assistant" and r.model == "tiny" and r.id.startswith("msg_")
    assert [b.type for b in r.content] == ["text"] and r.content[0].text
    assert r.stop_reason == "max_tokens" and r.stop_sequence is None and r.usage.output_tokens == 8
    assert r.usage.input_tokens + r.usage.cache_read_input_tokens == count(client, messages=HELLO) == 5
    again = client.messages.create(model="tiny", max_tokens=8, messages=HELLO, extra_body=GREEDY)
    assert again.content == r.content and again.token_sha == r.token_sha


@pytest.mark.slow
def test_streams_join_to_the_whole_reply(client, server):
    kw = {"model": "tiny", "max_tokens": 8, "messages": HELLO, "system": "Be brief."}
    whole = client.messages.create(**kw, extra_body=GREEDY)
    with client.messages.stream(**kw, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text and blocks(final.content) == blocks(whole.content)
    assert final.stop_reason == whole.stop_reason == "max_tokens" and final.usage.output_tokens == 8
    wire = [(n, d) for n, d in raw_events(server, {**kw, **GREEDY}) if n != "ping"]
    names = [n for n, _ in wire]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = wire[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["usage"]["output_tokens"] == 0
    delta = wire[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"]["output_tokens"] == 8 and delta["token_sha"] == whole.token_sha
    assert wire[-1] == ("message_stop", {"type": "message_stop"})


@pytest.mark.slow
def test_a_conversation_runs_the_chat_completion_it_means(client, server):
    """History with thinking, text and tool_use, a tool_result turn: the same ids as on the chat route."""
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "text", "text": "In Paris."}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Call it.", "signature": ""},
                                          {"type": "text", "text": "Checking."},
                                          {"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                                     {"type": "text", "text": "And now?", "cache_control": {"type": "ephemeral"}}]},
    ]  # fmt: skip
    # streamed: a prompt past the pages the prefix cache may hold, so pings come before the first block
    wire = raw_events(
        server, {"model": "tiny", "max_tokens": 6, "messages": history, "tools": TOOLS, "temperature": 0}
    )
    assert ("ping", {"type": "ping"}) in wire[: [n for n, _ in wire].index("content_block_start")]
    end = wire[-2][1]
    chat = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}, {"type": "text", "text": "In Paris."}]},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "Call it.", "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
        {"role": "user", "content": [{"type": "text", "text": "And now?"}]},
    ]  # fmt: skip
    fns = [{"type": "function", "function": {"name": t["name"], "description": t.get("description"),
                                             "parameters": t["input_schema"]}} for t in TOOLS]  # fmt: skip
    status, same, _ = post(server, "/v1/chat/completions",
                           {"model": "tiny", "messages": chat, "tools": fns, "max_tokens": 6, "temperature": 0})  # fmt: skip
    assert status == 200 and same["token_sha"] == end["token_sha"]
    tokens = count(client, messages=history, tools=TOOLS)
    assert (
        tokens
        == same["usage"]["prompt_tokens"]
        == end["usage"]["input_tokens"] + end["usage"]["cache_read_input_tokens"]
    )


def test_count_tokens_is_the_chat_prompt(client, server):
    """System blocks, consecutive turns of one role joined: count_tokens counts what /tokenize renders for chat."""
    system = [{"type": "text", "text": "You are terse."}, {"type": "text", "text": "Be kind."}]
    turns = [*HELLO, {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hi"},
             {"role": "assistant", "content": [{"type": "text", "text": "there"}]}, *HELLO]  # fmt: skip
    chat = [{"role": "system", "content": "You are terse.\n\nBe kind."}, *HELLO, {"role": "user", "content": "Again"},
            {"role": "assistant", "content": "Hi\n\nthere"}, *HELLO]  # fmt: skip
    status, body, _ = post(
        server, "/tokenize", {"messages": chat, "chat_template_kwargs": {"thinking": True}}
    )
    assert status == 200
    assert count(client, system=system, messages=turns, thinking={"type": "adaptive"}) == body["count"]


@pytest.mark.slow
def test_tool_choice_any_tool_none_and_auto(client, server):
    def one(choice):
        choice = dict(choice)
        limit = choice.pop("max_tokens", 96 if choice["type"] in ("any", "tool") else 24)
        return client.messages.create(model="tiny", max_tokens=limit, messages=ASK, tools=TOOLS, tool_choice=choice,
                                      extra_body={"temperature": 1.0, "seed": 3, "draft": False})  # fmt: skip

    choices = [{"type": "any", "disable_parallel_tool_use": True}, {"type": "tool", "name": "ping"},
               {"type": "none"}, {"type": "auto"}]  # fmt: skip
    one({"type": "none", "max_tokens": 1})  # alone first: the rest resume the long tools prompt's pages
    named_body = {"model": "tiny", "max_tokens": 96, "messages": ASK, "tools": TOOLS, "tool_choice": choices[1],
                  "temperature": 1.0, "seed": 3, "draft": False}  # fmt: skip
    with ThreadPoolExecutor(5) as pool:
        streamed = pool.submit(raw_events, server, named_body)
        anyone, named, none, auto = pool.map(one, choices)
        wire = streamed.result()
    for r, name in ((anyone, None), (named, "ping")):
        assert r.stop_reason == "tool_use", r
        (call,) = [b for b in r.content if b.type == "tool_use"]
        assert (
            call.id.startswith("toolu_")
            and call.name in {"get_weather", "ping"}
            and name in (None, call.name)
        )
        assert call.input in ({"city": "Paris"}, {"city": "Oslo"}, {"city": "Lima"}, {})
    assert none.stop_reason == "max_tokens" and [b.type for b in none.content] == ["text"]
    for r in (none, auto):
        assert all("DSML" not in b.text for b in r.content if b.type == "text")
    pieces = [d["delta"]["partial_json"] for n, d in wire if n == "content_block_delta"
              and d["delta"]["type"] == "input_json_delta"]  # fmt: skip
    assert json.loads("".join(pieces)) == named.content[-1].input == {} and pieces == ["{}"]
    assert wire[-2][1]["delta"]["stop_reason"] == "tool_use" and wire[-2][1]["token_sha"] == named.token_sha


@pytest.mark.slow
def test_thinking_enabled_disabled_and_omitted(client, server):
    kw = {"model": "tiny", "max_tokens": 6, "messages": HELLO, "extra_body": GREEDY}
    on = client.messages.create(thinking={"type": "enabled", "budget_tokens": 4}, **kw)
    (block,) = on.content
    assert block.type == "thinking" and block.thinking and block.signature == ""
    assert on.stop_reason == "max_tokens" and on.usage.output_tokens == 6
    with client.messages.stream(thinking={"type": "enabled", "budget_tokens": 4}, **kw) as stream:
        deltas = [e.delta.thinking for e in stream if e.type == "content_block_delta"]
    assert "".join(deltas) == block.thinking
    hidden = client.messages.create(thinking={"type": "adaptive", "display": "omitted"}, **kw)
    assert [(b.type, b.thinking) for b in hidden.content] == [
        ("thinking", "")
    ] and hidden.token_sha == on.token_sha
    off = client.messages.create(thinking={"type": "disabled"}, **kw)
    plain = client.messages.create(**kw)
    assert [b.type for b in off.content] == ["text"] and off.token_sha == plain.token_sha != on.token_sha
    thinking_prompt = count(client, messages=HELLO, thinking={"type": "enabled", "budget_tokens": 4})
    assert thinking_prompt > count(client, messages=HELLO, thinking={"type": "disabled"}) == 5


@pytest.mark.slow
def test_stop_sequences_say_which_one_stopped(client):
    kw = {"model": "tiny", "max_tokens": 16, "messages": HELLO, "extra_body": GREEDY}
    text = client.messages.create(**kw).content[0].text
    stop = text[5:9]
    assert len(stop) == 4 and stop not in text[:8]
    cut = client.messages.create(stop_sequences=["never-in-noise", stop], **kw)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[: text.index(stop)]
    with client.messages.stream(stop_sequences=[stop], **kw) as stream:
        final = stream.get_final_message()
    assert (
        final.stop_reason == "stop_sequence"
        and final.stop_sequence == stop
        and blocks(final.content) == blocks(cut.content)
    )


@pytest.mark.slow
def test_concurrent_equals_solo(server):
    base = {"model": "tiny", "max_tokens": 8, "messages": HELLO, "temperature": 0.9}
    bodies = [{**base, "seed": 60}, {**base, "temperature": 0, "system": "S"},
              {**base, "seed": 61, "thinking": {"type": "enabled", "budget_tokens": 4}},
              {**base, "seed": 62, "top_k": 20, "top_p": 0.9, "stop_sequences": ["zz"], "metadata": {"user_id": "u"}}]  # fmt: skip
    sha = lambda b: post(server, "/v1/messages", b)[1]["token_sha"]  # noqa: E731
    solo = [sha(b) for b in bodies]
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(sha, bodies)) == solo


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": HELLO}, "max_tokens"),
        ({"max_tokens": 0, "messages": HELLO}, "max_tokens"),
        ({"max_tokens": 4, "messages": HELLO, "frequency_penalty": 1}, "frequency_penalty"),
        ({"max_tokens": 4, "messages": HELLO, "temperature": 1.5}, "temperature"),
        ({"max_tokens": 4, "messages": []}, "messages"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         "messages[0].content[0].type"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "extra": 1}]}]},
         "messages[0].content[0].extra"),
        ({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": [
            {"type": "redacted_thinking", "data": "x"}]}, {"role": "user", "content": "y"}]}, "messages[1].content[0].type"),
        ({"max_tokens": 4, "messages": [*HELLO, {"role": "assistant", "content": "Hi"}]}, "messages[1]"),
        ({"max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"max_tokens": 4, "messages": HELLO, "system": [{"type": "image"}]}, "system[0].type"),
        ({"max_tokens": 4, "messages": HELLO, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
         "tools[0].type"),
        ({"max_tokens": 4, "messages": HELLO, "tools": [{"name": "a<b", "input_schema": {}}]}, "tools[0].name"),
        ({"max_tokens": 4, "messages": HELLO, "tools": [PING], "tool_choice": {"type": "tool"}}, "tool_choice.name"),
        ({"max_tokens": 4, "messages": HELLO, "tools": [PING], "tool_choice": {"type": "tool", "name": "x"}},
         "tool_choice.name"),
        ({"max_tokens": 4, "messages": HELLO, "tool_choice": {"type": "any"}}, "tool_choice"),
        ({"max_tokens": 4, "messages": HELLO, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"max_tokens": 4, "messages": HELLO, "thinking": {"type": "enabled", "budget_tokens": 4}},
         "thinking.budget_tokens"),
        ({"max_tokens": 4, "messages": HELLO, "thinking": {"type": "between_tools"}}, "thinking.type"),
        ({"max_tokens": 4, "messages": HELLO, "stop_sequences": ["s"] * 17}, "stop_sequences"),
        ({"max_tokens": 4, "messages": HELLO, "container": "c1"}, "container"),
        ({"max_tokens": 4, "messages": HELLO, "speed": "fast"}, "speed"),
        ({"max_tokens": 4, "messages": HELLO, "output_config": {"format": {"type": "json_schema", "schema": {
            "type": "string", "format": "bogus"}}}}, "output_config.format"),
        ({"max_tokens": 4000, "messages": [{"role": "user", "content": "x " * 200}]}, "messages"),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_field(server, body, field):
    status, reply, _ = post(server, "/v1/messages", body)
    assert status == 400 and reply["type"] == "error", reply
    assert reply["error"]["type"] == "invalid_request_error" and reply["error"]["message"].startswith(
        field
    ), reply


def test_other_refusals_take_anthropics_shape(client, server):
    for raw in (b"{not json", b"[1, 2]"):
        status, reply, _ = post(server, "/v1/messages", raw)
        assert status == 400 and reply["error"]["type"] == "invalid_request_error", reply
    with pytest.raises(anthropic.NotFoundError) as caught:
        client.messages.create(model="claude-nope", max_tokens=2, messages=HELLO)
    assert (
        caught.value.body["error"]["type"] == "not_found_error"
        and "model" in caught.value.body["error"]["message"]
    )
    status, reply, _ = post(server, "/v1/messages/batches", {})
    assert status == 404 and reply["error"]["type"] == "not_found_error"
    status, reply, _ = server.request("GET", "/v1/messages")
    assert status == 405 and reply["type"] == "error"
    status, reply, _ = post(server, "/v1/messages/count_tokens", {"messages": HELLO, "max_tokens": 3})
    assert status == 400 and reply["error"]["message"].startswith("max_tokens")


def test_fields_clients_send_are_accepted(client):
    r = client.messages.create(
        model="tiny", max_tokens=2, messages=HELLO, metadata={"user_id": "u-1"}, service_tier="auto",
        cache_control={"type": "ephemeral"}, inference_geo="us", speed="standard",
        output_config={"effort": "low"}, extra_body={"top_k": 5, "top_p": 0.5, "temperature": 0.3, "seed": 1},
        extra_headers={"anthropic-beta": "prompt-caching-2024-07-31"},
    )  # fmt: skip
    assert r.usage.output_tokens == 2 and r.content[0].type == "thinking"  # an effort turns thinking on


class _Engine:
    """An engine stand-in that must never be reached while draining."""

    def submit(self, requests):
        raise AssertionError("a draining server admitted a request")


def test_a_draining_server_is_overloaded():
    """529 overloaded_error, counted before the drain flag is read (the race rule), Retry-After 30."""
    from tfc.runtime.server.auth import ApiKeys
    from tfc.runtime.server.messages import create_message
    from tfc.runtime.server.state import ServerState

    state = ServerState(model_name="tiny", keys=ApiKeys([]), engine=_Engine(), status="ready")
    seen = []

    def drain_starts_now():
        seen.append(state.inflight)
        state.status = "draining"

    state.after_count = drain_starts_now
    reply = asyncio.run(create_message(state, json.dumps({"max_tokens": 2, "messages": HELLO}).encode()))
    assert seen == [1] and reply.status_code == 529 and state.inflight == 0
    assert reply.headers["retry-after"] == "30" and reply.headers["connection"] == "close"
    assert json.loads(reply.body)["error"]["type"] == "overloaded_error"


@pytest.mark.slow
def test_a_keyed_server_takes_both_headers_and_is_overloaded_while_draining(served_image, tmp_path):
    """x-api-key and Bearer both work, a wrong or missing key is 401 authentication_error; once a drain starts,
    a new message is 529 overloaded_error and a stream still running at the deadline ends with an error event."""
    import urllib.request

    with ServerProcess(served_image, "--model-name", "tiny", "--api-key", KEY, "--drain-s", "1.5",
                       log=tmp_path / "log") as s:  # fmt: skip
        client = anthropic.Anthropic(base_url=s.url, api_key=KEY, max_retries=0)
        bearer = anthropic.Anthropic(base_url=s.url, auth_token=KEY, max_retries=0)
        reply = client.messages.create(model="tiny", max_tokens=2, messages=HELLO, extra_body=GREEDY)
        assert reply.usage.output_tokens == 2
        assert bearer.messages.count_tokens(model="tiny", messages=HELLO).input_tokens == 5
        for wrong in (anthropic.Anthropic(base_url=s.url, api_key="nope", max_retries=0),
                      anthropic.Anthropic(base_url=s.url, auth_token="nope", max_retries=0)):  # fmt: skip
            with pytest.raises(anthropic.AuthenticationError) as caught:
                wrong.messages.create(model="tiny", max_tokens=2, messages=HELLO)
            assert caught.value.body == {"type": "error", "error": {"type": "authentication_error",
                                                                    "message": "missing or invalid API key"}}  # fmt: skip
        status, body, headers = s.request("POST", "/v1/messages/count_tokens", {"messages": HELLO})
        assert (
            status == 401
            and body["error"]["type"] == "authentication_error"
            and "www-authenticate" in headers
        )

        body = {"model": "tiny", "max_tokens": 3000, "messages": HELLO, "stream": True, "temperature": 0}
        req = urllib.request.Request(s.url + "/v1/messages", json.dumps(body).encode(),
                                     {"content-type": "application/json", "x-api-key": KEY})  # fmt: skip
        with urllib.request.urlopen(req, timeout=60) as r:
            assert r.readline() == b"event: message_start\n"
            s.signal(signal.SIGTERM)
            time.sleep(0.3)
            with pytest.raises(anthropic.OverloadedError) as caught:
                client.messages.create(model="tiny", max_tokens=2, messages=HELLO)
            assert caught.value.body["error"]["type"] == "overloaded_error"
            assert caught.value.response.headers["retry-after"] == "30"
            tail = r.read().decode().strip().split("\n\n")
        name, data = tail[-1].split("\n", 1)
        assert name == "event: error" and json.loads(data[6:])["error"]["type"] == "overloaded_error"
        assert s.proc.wait(20) == 0
