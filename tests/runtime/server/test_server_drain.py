"""Graceful drain (serving.md section 4): refuse new work with 503, let in-flight work finish, cut at the deadline."""

from __future__ import annotations

import asyncio
import http.client
import json
import signal
import time

import pytest
from support.server import ServerProcess

LONG = {
    "model": "tiny",
    "prompt": "Hello",
    "max_tokens": 3000,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}


def _open_stream(port: int, body: dict):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200
    assert r.readline().startswith(b"data: ")  # tokens are flowing
    return conn, r


def _rest(r) -> list[bytes]:
    return [line.strip() for line in iter(r.readline, b"") if line.strip()]


@pytest.mark.slow
def test_drain_refuses_new_work_and_ends_what_outlives_the_deadline(served_image, tmp_path):
    with ServerProcess(served_image, "--model-name", "tiny", "--drain-s", "1.5", log=tmp_path / "log") as s:
        conn, r = _open_stream(s.port, LONG)
        s.signal(signal.SIGTERM)
        time.sleep(0.3)
        status, reply, headers = s.request(
            "POST", "/v1/completions", {**LONG, "stream": False, "max_tokens": 2}
        )
        assert status == 503 and headers["retry-after"] == "30", headers
        assert reply["error"] == {"message": "server restarting: retry shortly", "type": "server_error",
                                  "param": None, "code": "server_restarting"}  # fmt: skip
        status, health, _ = s.get("/health")
        assert status == 503 and health["status"] == "draining"
        tail = _rest(r)
        conn.close()
        assert tail[-1] == b"data: [DONE]"
        error = json.loads(tail[-2][len(b"data: ") :])
        assert error["error"]["type"] == "server_error" and "drain deadline" in error["error"]["message"]
        assert s.proc.wait(20) == 0


def _boot_statuses(s: ServerProcess) -> list[tuple[int, str]]:
    """/health's (status, "status") from the first answer to the first 200; requests while 503 are checked."""
    seen, deadline = [], time.monotonic() + 90
    while True:
        assert s.proc.poll() is None and time.monotonic() < deadline, s.output()
        try:
            status, body, _headers = s.get("/health")
        except OSError:
            time.sleep(0.01)
            continue
        seen.append((status, body["status"] if isinstance(body, dict) else body))
        if status == 503:
            code, reply, h = s.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1})
            assert code == 200 or (code == 503 and reply["error"]["code"] == "booting" and "retry-after" in h)
        if status == 200:
            return seen
        time.sleep(0.02)


@pytest.mark.slow
def test_booting_then_a_drain_lets_one_finish_and_a_second_signal_cuts_it_short(served_image, tmp_path):
    """/health is 503 "booting" until ready; a drain lets a request in flight finish; a second signal ends it."""
    s = ServerProcess(served_image, "--model-name", "tiny", "--drain-s", "60", log=tmp_path / "log")
    try:
        seen = _boot_statuses(s)
        assert (503, "booting") in seen and seen[-1] == (200, "ready")
        short_conn, short = _open_stream(s.port, {**LONG, "max_tokens": 40})
        long_conn, long = _open_stream(s.port, LONG)
        s.signal(signal.SIGTERM)
        tail = _rest(short)  # the drain lets it finish
        short_conn.close()
        assert tail[-1] == b"data: [DONE]"
        finals = [json.loads(t[6:]) for t in tail[:-1] if t.startswith(b"data: {")]
        assert finals[-1]["choices"][0]["finish_reason"] == "length"
        started = time.monotonic()
        s.signal(signal.SIGINT)  # the long one would outlive the 60 s drain: a second signal cuts it
        tail = _rest(long)
        long_conn.close()
        assert tail[-1] == b"data: [DONE]" and b"drain cut short" in tail[-2]
        assert s.proc.wait(20) == 0 and time.monotonic() - started < 10
    finally:
        s.stop()


class _Engine:
    """An engine stand-in that must never be reached while draining."""

    info = type("Info", (), {"eos_ids": (), "context": 64, "vocab_size": 10})()
    config = type("Config", (), {"max_context": 64})()

    def submit(self, requests):
        raise AssertionError("a draining server admitted a request")


def test_a_request_is_counted_before_the_drain_flag_is_read():
    """The race rule: a drain that starts between the count and the check still refuses, and saw the count."""
    from tfc.runtime.server.auth import ApiKeys
    from tfc.runtime.server.completions import generation
    from tfc.runtime.server.protocol import CompletionRequest
    from tfc.runtime.server.state import ServerState

    state = ServerState(model_name="tiny", keys=ApiKeys([]), engine=_Engine(), status="ready")
    seen = []

    def drain_starts_now():
        seen.append(state.inflight)  # what a drain starting here would wait for
        state.status = "draining"

    state.after_count = drain_starts_now
    reply = asyncio.run(generation(state, CompletionRequest(prompt="x"), chat=False))
    assert seen == [1] and reply.status_code == 503 and state.inflight == 0
    assert json.loads(reply.body)["error"]["code"] == "server_restarting"
