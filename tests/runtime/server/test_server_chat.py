"""Chat features of `tfc serve` through the official openai client: structured outputs, tool calls, reasoning, logprobs.

The tiny model is random, so its text is noise: what holds it to a schema or a calls block is constrained
decoding, and that is what these tests check, request after request.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.chat_schemas import SCHEMAS, WEATHER, valid


@pytest.fixture
def client(server):
    """The official client with room for the long prompts a tools section makes on a loaded 2-core machine."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


def _schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


@pytest.mark.slow
def test_json_schema_holds_a_random_model_every_time(client):
    # serial ("draft": false, as in the tool-choice tests below): drafting under a grammar is test_drafting's and
    # test_server_draft's; here the reference runner's per-sequence DSpark passes would add a quarter to the time
    def one(i: int):
        schema = SCHEMAS[i % len(SCHEMAS)]
        r = client.chat.completions.create(model="tiny", messages=USER, max_tokens=120, temperature=1.0, seed=i,
                                           response_format=_schema_format(schema), extra_body={"draft": False})  # fmt: skip
        return schema, r

    with ThreadPoolExecutor(16) as pool:
        replies = list(pool.map(one, range(16)))
    for schema, r in replies:
        choice = r.choices[0]
        assert choice.finish_reason == "stop", choice
        assert valid(json.loads(choice.message.content), schema), choice.message.content


@pytest.mark.slow
def test_json_object_and_a_streamed_schema(client):
    kw = {"model": "tiny", "messages": USER, "max_tokens": 120, "temperature": 1.0, "seed": 11,
          "response_format": _schema_format(SCHEMAS[1])}  # fmt: skip
    with ThreadPoolExecutor(3) as pool:  # the three replies side by side: one batch's steps, not three
        loose = pool.submit(client.chat.completions.create, model="tiny", messages=USER, max_tokens=64,
                            temperature=0.7, seed=3, response_format={"type": "json_object"})  # fmt: skip
        streamed = pool.submit(lambda: list(client.chat.completions.create(stream=True, **kw)))
        whole, r, chunks = client.chat.completions.create(**kw), loose.result(), streamed.result()
    text = r.choices[0].message.content
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == whole.choices[0].message.content
    )
    assert valid(json.loads(whole.choices[0].message.content), SCHEMAS[1])


def _check_call(call, tools: list[dict]) -> None:
    fns = {t["function"]["name"]: t["function"] for t in tools}
    assert call.type == "function" and call.id.startswith("call_") and call.function.name in fns
    assert valid(json.loads(call.function.arguments), fns[call.function.name]["parameters"])


@pytest.mark.slow
def test_tool_choice_required_always_yields_a_parseable_call(client):
    def one(i: int):
        return client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER, PING], tool_choice="required",
                                              max_tokens=96, temperature=1.0, seed=100 + i,
                                              extra_body={"draft": False})  # fmt: skip

    with ThreadPoolExecutor(2) as pool:  # a second wave resumes the long tools prompt from the prefix cache
        replies = list(pool.map(one, range(4)))
    for r in replies:
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls, choice
        assert not choice.message.content
        for call in choice.message.tool_calls:
            _check_call(call, [WEATHER, PING])


@pytest.mark.slow
def test_a_named_tool_choice_streams_arguments_that_join_into_its_json(client):
    kw = {"model": "tiny", "messages": USER, "tools": [WEATHER, PING], "max_tokens": 96, "temperature": 1.0,
          "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "extra_body": {"draft": False}}  # fmt: skip
    with ThreadPoolExecutor(4) as pool:  # both seeds, whole and streamed, side by side
        wholes = [pool.submit(client.chat.completions.create, seed=seed, **kw) for seed in range(2)]
        streams = [pool.submit(lambda s: list(client.chat.completions.create(seed=s, stream=True, **kw)), seed)
                   for seed in range(2)]  # fmt: skip
    for whole, chunks in zip((f.result() for f in wholes), (f.result() for f in streams), strict=True):
        (call,) = whole.choices[0].message.tool_calls
        assert call.function.name == "get_weather"
        _check_call(call, [WEATHER])
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert deltas[0].id and deltas[0].function.name == "get_weather" and len(deltas) >= 2
        assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
        assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert chunks[-1].choices[0].finish_reason == "tool_calls"
        assert chunks[-1].choices[0].token_sha == whole.choices[0].token_sha


@pytest.mark.slow
def test_tool_choice_none_and_auto_never_leak_markup(client):
    def one(choice: str):
        return client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER], tool_choice=choice,
                                              max_tokens=24, temperature=1.0, seed=0)  # fmt: skip

    with ThreadPoolExecutor(2) as pool:
        replies = dict(zip(("none", "auto"), pool.map(one, ("none", "auto")), strict=True))
    for choice, r in replies.items():
        assert "｜DSML｜ calls" not in (r.choices[0].message.content or "")
        if choice == "none":
            assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "length"


@pytest.mark.slow
def test_a_tool_round_trip_renders(client, server):
    msgs = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sunny": true}'}]  # fmt: skip
    r = client.chat.completions.create(
        model="tiny", messages=msgs, tools=[WEATHER], max_tokens=4, temperature=0
    )
    status, body, _ = server.request("POST", "/tokenize", {"messages": msgs, "tools": [WEATHER]})
    assert status == 200 and body["count"] == r.usage.prompt_tokens


@pytest.mark.slow
def test_thinking_cut_by_max_tokens_says_so(client):
    kw = {"model": "tiny", "messages": USER, "max_tokens": 6, "temperature": 0,
          "extra_body": {"chat_template_kwargs": {"thinking": True}}}  # fmt: skip
    r = client.chat.completions.create(**kw)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    reasoning = choice.message.reasoning_content
    assert reasoning and choice.message.reasoning == reasoning and "max_tokens" in choice.finish_detail
    assert r.usage.completion_tokens_details.reasoning_tokens == r.usage.completion_tokens == 6
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    joined = [
        "".join(getattr(d, key, None) or "" for d in deltas) for key in ("reasoning_content", "reasoning")
    ]
    assert joined == [reasoning, reasoning]
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 6


@pytest.mark.slow
def test_tokenize_gives_the_ids_the_model_sees(client, server):
    body = {"messages": USER, "tools": [WEATHER], "chat_template_kwargs": {"enable_thinking": True},
            "reasoning_effort": "max", "response_format": {"type": "json_object"}}  # fmt: skip
    status, out, _ = server.request("POST", "/tokenize", body)
    assert status == 200 and out["tokens"][:2] == [0, 633] and out["tokens"][-2:] == [635, 636]
    r = client.chat.completions.create(model="tiny", messages=USER, tools=[WEATHER], reasoning_effort="max", max_tokens=2,
                                       response_format={"type": "json_object"},
                                       extra_body={"chat_template_kwargs": {"enable_thinking": True}})  # fmt: skip
    assert r.usage.prompt_tokens == out["count"]
    _, plain, _ = server.request("POST", "/tokenize", {"messages": USER})
    assert plain["tokens"][-2:] == [635, 637]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tool_choice": "required"}, "tool_choice"),
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"thinkin": True}}, "chat_template_kwargs.thinkin"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string",
          "format": "bogus"}, "strict": True}}}, "response_format"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice.function.name"),
        ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ],
)  # fmt: skip
def test_refusals_name_the_field(server, extra, param):
    status, body, _ = server.request(
        "POST", "/v1/chat/completions", {"messages": USER, "max_tokens": 2, **extra}
    )
    assert status == 400 and body["error"]["param"] == param, body


def test_chat_logprobs_are_ordered_and_hold_the_pick(client):
    r = client.chat.completions.create(model="tiny", messages=USER, max_tokens=8, temperature=0, logprobs=True,
                                       top_logprobs=20)  # fmt: skip
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens == 8
    for e in entries:
        values = [t.logprob for t in e.top_logprobs]
        assert len(values) == 20 and values == sorted(values, reverse=True)
        assert e.top_logprobs[0].token == e.token and e.top_logprobs[0].logprob == e.logprob
        assert 0.0 < sum(math.exp(v) for v in values) <= 1.0 + 1e-9
        assert bytes(e.bytes).decode(errors="replace") == e.token or "\ufffd" in e.token


def test_completion_logprobs_equal_the_model_logits(client, served_image):
    torch = pytest.importorskip("torch")
    from tfc.runtime.options import RuntimeOptions
    from tfc.runtime.worker.step import SequenceStep, StepPlan
    from tfc.runtime.worker.worker import Worker

    ids = [0, 297, 315, 522, 363, 331, 265, 317, 518]
    r = client.completions.create(model="tiny", prompt=ids, max_tokens=3, temperature=0, logprobs=20)
    lp = r.choices[0].logprobs
    worker = Worker.start(served_image, device="cpu", options=RuntimeOptions(graphs=False))
    try:
        worker.load_model(dtype=torch.float32, slots=1)
        logits = worker.execute(StepPlan((SequenceStep(0, tuple(ids), 0),))).logits[0]
    finally:
        worker.close()
    ref = torch.log_softmax(logits.double(), 0)
    best = torch.sort(ref, descending=True, stable=True)
    assert lp.token_logprobs[0] == pytest.approx(float(best.values[0]), abs=1e-6)
    best20 = best.values[:20].tolist()
    values = list(lp.top_logprobs[0].values())  # a dict by token text: ids that decode alike share an entry
    assert values == sorted(values, reverse=True) and values[0] == pytest.approx(best20[0], abs=1e-6)
    assert all(min(abs(v - b) for b in best20) < 1e-6 for v in values)
    assert len(lp.tokens) == 3 and lp.text_offset[0] == 0


@pytest.mark.slow
def test_concurrent_equals_solo_with_grammars_tools_and_logprobs(server):
    bodies = []
    for i in range(8):
        body = {"model": "tiny", "messages": USER, "max_tokens": 32, "temperature": 0.9, "seed": 40 + i}
        if i % 4 in (0, 1):
            body["response_format"] = _schema_format(SCHEMAS[i % len(SCHEMAS)])
        if i % 4 == 1:
            body.update(logprobs=True, top_logprobs=3)
        if i % 4 == 2:
            body.update(tools=[WEATHER, PING], tool_choice="required")
        if i % 4 == 3:
            body.update(logprobs=True, top_logprobs=5, tools=[WEATHER])
        bodies.append(body)
    post = lambda b: server.request("POST", "/v1/chat/completions", b, timeout=600)[1]["token_sha"]  # noqa: E731
    solo = [post(b) for b in bodies]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(post, bodies))
    assert together == solo
