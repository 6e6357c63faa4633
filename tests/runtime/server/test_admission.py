"""What the generation routes share (runtime/server/admission.py), without a model: a server that is not ready
refuses in each API's shape, every route names a field with its index in brackets, and one SSE event writer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient
from tfc.runtime.server import sse
from tfc.runtime.server.admission import BadRequest, Refusal, field_path, not_ready
from tfc.runtime.server.app import build_app
from tfc.runtime.server.auth import ApiKeys
from tfc.runtime.server.messages_protocol import MessagesRequest, parse
from tfc.runtime.server.messages_request import translate
from tfc.runtime.server.state import ServerState

USER = [{"role": "user", "content": "x"}]
BODIES = {
    "/v1/chat/completions": {"messages": USER},
    "/v1/completions": {"prompt": "x"},
    "/v1/responses": {"input": "x"},
    "/v1/messages": {"max_tokens": 2, "messages": USER},
}


def _client(status: str) -> TestClient:
    return TestClient(build_app(ServerState(model_name="m", keys=ApiKeys([]), status=status, failure="gone")))


@pytest.mark.parametrize(
    ("status", "openai", "anthropic"),
    [
        ("booting", (503, "booting", "5", None), (503, "api_error", "5", None)),
        ("draining", (503, "server_restarting", "30", "close"), (529, "overloaded_error", "30", "close")),
        ("failed", (503, "engine_dead", None, None), (500, "api_error", None, None)),
    ],
)
def test_a_server_that_is_not_ready_refuses_in_each_apis_shape(status, openai, anthropic):
    client = _client(status)
    for route, body in BODIES.items():
        reply = client.post(route, json=body)
        error = reply.json()["error"]
        kind = error["type"] if route == "/v1/messages" else error["code"]
        got = (reply.status_code, kind, reply.headers.get("retry-after"), reply.headers.get("connection"))
        assert got == (anthropic if route == "/v1/messages" else openai), (route, reply.json())
        assert ("gone" in error["message"]) == (status == "failed")


def test_a_refusal_carries_what_each_shape_needs():
    refusal = not_ready(ServerState(model_name="m", keys=ApiKeys([]), status="draining"))
    assert (refusal.status, refusal.code, refusal.retry_after, refusal.close) == (
        503,
        "server_restarting",
        30,
        True,
    )
    bad = BadRequest("n: must be at least 1", "n")
    assert isinstance(bad, Refusal) and (bad.status, bad.param, bad.retry_after, bad.close) == (
        400,
        "n",
        None,
        False,
    )


def test_every_route_names_a_field_with_its_index_in_brackets():
    assert field_path(["messages", 0, "content", 1, "type"]) == "messages[0].content[1].type"
    assert field_path(["logit_bias", "7"]) == "logit_bias.7" and field_path([]) == ""
    reply = _client("booting").post(
        "/v1/chat/completions",
        json={"messages": USER, "tools": [{"type": "function", "function": {"name": "f", "x": 1}}]},
    )
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools[0].function.x"
    with pytest.raises(BadRequest) as caught:
        translate(
            parse(
                MessagesRequest,
                {"max_tokens": 2, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            )
        )
    assert caught.value.param == "messages[0].content[0].text"
    with pytest.raises(BadRequest) as caught:
        translate(
            parse(
                MessagesRequest, {"max_tokens": 2, "messages": [*USER, {"role": "assistant", "content": "y"}]}
            )
        )
    assert caught.value.param == "messages[1]" and caught.value.message.startswith("messages[1]: ")
    body = {
        "max_tokens": 2,
        "messages": USER,
        "tools": [{"name": "t", "input_schema": {}}, {"type": "web_search"}],
    }
    with pytest.raises(BadRequest) as caught:
        translate(parse(MessagesRequest, body))
    assert caught.value.param == "tools[1].type"


def test_sse_writes_data_frames_and_typed_events_alike():
    assert sse.frame({"a": "é"}) == 'data: {"a":"é"}\n\n'.encode()
    assert sse.event("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'
    framed = sse.event("response.created", {"type": "response.created", "n": [1, 2]}).decode()
    name, data = framed.removesuffix("\n\n").split("\n")
    assert name == "event: response.created" and json.loads(data.removeprefix("data: "))["n"] == [1, 2]


def test_the_http_package_boots_nothing():
    """runtime/server/ serves an engine it is handed: importing it loads no boot, worker, model or TP code (the
    runner contract's data and protocols aside); runtime/serve.py does the wiring."""
    code = (
        "import sys, tfc.runtime.server.app\n"
        "bad = [m for m in sys.modules if m.startswith(('tfc.runtime.boot', 'tfc.runtime.models', "
        "'tfc.runtime.parallel', 'tfc.runtime.graphs', 'tfc.runtime.worker.worker')) or m == 'tfc.runtime.serve']\n"
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
