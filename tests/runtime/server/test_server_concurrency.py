"""Concurrent == solo by token_sha, disconnects free slots, capacity refusals come before the head, bounded load."""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.server import ServerProcess

PROMPTS = ["The model reads the prompt", "Hello", "layer norm experts", "a b c d e f g", "tokens tokens"]


def _body(i: int, seeded: bool) -> dict:
    body = {"model": "tiny", "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 6 + i % 5, "temperature": 0}
    if seeded:
        body.update(temperature=0.9, top_p=0.9, seed=100 + i)
    if i % 4 >= 2:  # a quarter greedy, a quarter sampled, each with penalties and a bias
        body.update(
            frequency_penalty=0.8, presence_penalty=0.3, repetition_penalty=1.2, logit_bias={str(i): 2.5}
        )
    return body


@pytest.mark.slow
def test_sixteen_concurrent_requests_equal_their_solo_runs(server):
    bodies = [_body(i, seeded=i % 2 == 1) for i in range(16)]
    solo = [server.request("POST", "/v1/completions", b)[1]["token_sha"] for b in bodies]
    with ThreadPoolExecutor(16) as pool:
        together = list(
            pool.map(lambda b: server.request("POST", "/v1/completions", b)[1]["token_sha"], bodies)
        )
    assert together == solo
    streamed = []
    with ThreadPoolExecutor(16) as pool:
        streamed = list(pool.map(lambda b: _stream_sha(server.port, b), bodies))
    assert streamed == solo


def _stream_sha(port: int, body: dict) -> str:
    events = _sse(port, "/v1/completions", {**body, "stream": True})
    finals = [
        e for e in events if isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason")
    ]
    return finals[-1]["choices"][0]["token_sha"]


def _sse(port: int, path: str, body: dict, stop_after: int | None = None) -> list:
    """The frames of an SSE reply ("[DONE]", dicts, or ":" comments); stop reading after `stop_after` frames."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, r.read()
    out, buf = [], b""
    while True:
        line = r.readline()
        if not line:
            break
        buf += line
        if line == b"\n":
            frame, buf = buf.strip(), b""
            if frame.startswith(b":"):
                out.append(frame.decode())
            elif frame == b"data: [DONE]":
                out.append("[DONE]")
                break
            else:
                out.append(json.loads(frame[len(b"data: ") :]))
            if stop_after is not None and len(out) >= stop_after:
                break
    conn.close()
    return out


@pytest.fixture(scope="module")
def one_slot(served_image, tmp_path_factory):
    """A server with one slot and no queue, keepalives every 0.05 s."""
    log = tmp_path_factory.mktemp("one-slot") / "log"
    with ServerProcess(served_image, "--max-seqs", "1", "--max-waiting", "0", "--model-name", "tiny",
                       env={"TFC_SSE_KEEPALIVE_S": "0.05"}, log=log) as s:  # fmt: skip
        yield s


LONG = {"model": "tiny", "prompt": "Hello", "max_tokens": 3000, "temperature": 0, "ignore_eos": True}


@pytest.mark.slow
def test_over_capacity_is_refused_before_the_head_and_a_disconnect_frees_the_slot(one_slot):
    conn = http.client.HTTPConnection("127.0.0.1", one_slot.port, timeout=60)
    conn.request(
        "POST", "/v1/completions", json.dumps({**LONG, "stream": True}), {"Content-Type": "application/json"}
    )
    r = conn.getresponse()
    assert r.status == 200
    r.readline()  # the first frame is flowing: the slot is taken
    status, reply, headers = one_slot.request("POST", "/v1/completions", {**LONG, "stream": True})
    assert status == 429 and reply["error"]["type"] == "rate_limit_error" and "retry-after" in headers
    conn.close()  # the client goes away mid-stream
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status, body, _ = one_slot.request("POST", "/v1/completions", {**LONG, "max_tokens": 2})
        if status == 200:
            break
        time.sleep(0.05)
    assert status == 200, body
    health = one_slot.get("/health")[1]
    assert health["running"] == 0 and health["waiting"] == 0


@pytest.fixture(scope="module")
def three_slots(served_image, tmp_path_factory):
    """A server with three slots and no queue."""
    log = tmp_path_factory.mktemp("three-slots") / "log"
    with ServerProcess(
        served_image, "--max-seqs", "3", "--max-waiting", "0", "--model-name", "tiny", log=log
    ) as s:
        yield s


@pytest.mark.slow
def test_a_burst_right_after_abandoned_streams_is_admitted(three_slots):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=three_slots.url + "/v1", api_key="unused", max_retries=0, timeout=60)

    def one(_: int) -> int:
        try:
            client.completions.create(model="tiny", prompt="Hello", max_tokens=2, temperature=0)
        except openai.APIStatusError as error:
            return error.status_code
        return 200

    for _ in range(3):  # each round drops a full house mid-step: its slots must count as free at once
        streams = [client.completions.create(model="tiny", prompt="Hello", max_tokens=3000, temperature=0, stream=True,
                                             extra_body={"ignore_eos": True}) for _ in range(3)]  # fmt: skip
        for stream in streams:
            next(iter(stream))  # its first token came: it holds a slot
        for stream in streams:
            stream.close()  # the client goes away mid-stream
        with ThreadPoolExecutor(3) as pool:
            assert list(pool.map(one, range(3))) == [200] * 3


@pytest.mark.slow
def test_keepalives_flow_until_the_first_token(one_slot):
    events = _sse(
        one_slot.port, "/v1/completions", {**LONG, "max_tokens": 3, "stream": True, "prompt": "x " * 900}
    )
    first_data = next(i for i, e in enumerate(events) if isinstance(e, dict))
    assert any(e == ": keepalive" for e in events[: first_data + 1]), events[:5]
    assert all(e != ": keepalive" for e in events[first_data + 2 :])


@pytest.mark.slow
def test_bounded_load_has_no_errors_and_flat_memory(server):
    """200 requests, 32 in flight, stops by itself; RSS of the first 50 against the last 50."""

    def one(i: int) -> int:
        return server.request("POST", "/v1/completions", {**_body(i, i % 3 == 0), "max_tokens": 3})[0]

    rss = []
    started = time.monotonic()
    with ThreadPoolExecutor(32) as pool:
        for lo in range(0, 200, 50):
            codes = list(pool.map(one, range(lo, lo + 50)))
            assert codes == [200] * 50
            rss.append(server.rss_kib())
            assert time.monotonic() - started < 240
    assert rss[-1] - rss[0] < 32 * 1024, rss  # under 32 MiB growth from the first 50 to the last 50
