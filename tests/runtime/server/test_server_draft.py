"""`tfc serve` drafting, through the official openai client: drafted replies equal `"draft": false` ones (text and
token_sha; greedy, seeded, 3 and 16 choices at once, a JSON schema, a stop string, streamed), usage.tfc_draft counts
each reply's rounds, /health and /metrics the server's; `--no-draft` turns it off and says so."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.server import ServerProcess

PROMPT = "The model reads the prompt"
SEEDED = {"temperature": 1.0, "top_p": 0.9, "seed": 7}
SCHEMA = {"type": "json_schema", "json_schema": {"name": "flags", "schema": {
    "type": "array", "maxItems": 3, "items": {"type": "boolean"}}}}  # fmt: skip
SERIAL = {"extra_body": {"draft": False}}


def _metric(server, name: str) -> float:
    _, text, _ = server.get("/metrics")
    m = re.search(rf'^tfc:{name}_total\{{model_name="tiny"\}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def _counts(reply) -> dict:
    return reply.usage.model_extra["tfc_draft"]


def _pair(create, **kw) -> tuple:
    """(drafted, serial) replies of one request, sent side by side so they share the server's steps."""
    with ThreadPoolExecutor(2) as pool:
        drafted, serial = pool.submit(create, **kw), pool.submit(create, **kw, **SERIAL)
        return drafted.result(), serial.result()


@pytest.fixture(scope="module")
def fresh(served_image, tmp_path_factory):
    """A server of its own: its drafting gate has seen no round yet (rounds of random weights close it)."""
    log = tmp_path_factory.mktemp("draft-serve") / "serve.log"
    with ServerProcess(served_image, "--max-seqs", "16", "--model-name", "tiny", log=log) as proc:
        yield proc


def test_drafted_replies_equal_serial_ones(fresh):
    openai = pytest.importorskip("openai")
    client, server = (
        openai.OpenAI(base_url=fresh.url + "/v1", api_key="unused", max_retries=0, timeout=60),
        fresh,
    )
    # solo greedy (the first rounds: they draft); 3 seeded choices; 16 (32 streams fill the step: no drafts).
    # Random weights reject drafts, so after 16 rounds the server drafts only a probe every 64 steps:
    # later replies are checked for their tokens alone.
    for n, kw in ((1, {"temperature": 0}), (3, SEEDED), (16, SEEDED)):
        drafted, serial = _pair(
            client.completions.create, model="tiny", prompt=PROMPT, max_tokens=5, n=n, **kw
        )
        assert [c.token_sha for c in drafted.choices] == [c.token_sha for c in serial.choices]
        assert [c.text for c in drafted.choices] == [c.text for c in serial.choices]
        if n == 1:
            assert _counts(drafted)["drafts"] >= 1 and _counts(drafted)["draft_tokens"] > 0
        assert _counts(serial) == {"drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}
    msgs = [{"role": "user", "content": "Hello"}]
    asks = [{"max_tokens": 8, **SEEDED}, {"max_tokens": 12, "response_format": SCHEMA, "temperature": 0},
            {"max_tokens": 8, "temperature": 0}, {"max_tokens": 8, "temperature": 0}]  # fmt: skip
    replies = []
    for kw in asks:
        if len(replies) == 3:  # a stop string from the middle of the greedy reply
            stop = replies[2][len(replies[2]) // 2 :][:2]
            kw["stop"] = [stop]
        drafted, serial = _pair(client.chat.completions.create, model="tiny", messages=msgs, **kw)
        assert drafted.choices[0].message.content == serial.choices[0].message.content
        assert drafted.choices[0].token_sha == serial.choices[0].token_sha
        replies.append(serial.choices[0].message.content)
    assert replies[1].startswith("[") and replies[3] == replies[2][: replies[2].index(stop)]
    chunks = list(client.chat.completions.create(model="tiny", messages=msgs, stream=True,
                                                 stream_options={"include_usage": True}, **asks[0]))  # fmt: skip
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == replies[0]
    assert "drafts" in chunks[-1].usage.model_extra["tfc_draft"]
    health = server.get("/health")[1]["drafting"]
    assert health["on"] and health["note"].startswith("drafting on") and health["drafts"] > 0
    assert _metric(server, "spec_decode_num_drafts") == health["drafts"]
    assert _metric(server, "spec_decode_num_draft_tokens") >= health["draft_tokens"] > 0
    assert re.search(r"^tfc:spec_decode_num_accepted_tokens_total", server.get("/metrics")[1], re.M)


def test_no_draft_turns_drafting_off_and_says_so(served_image, tmp_path, client):
    log = tmp_path / "serve.log"
    flags = ("--no-draft", "--max-seqs", "2", "--model-name", "tiny")
    with ServerProcess(served_image, *flags, log=log) as proc:
        health = proc.get("/health")[1]["drafting"]
        assert health == {"on": False, "note": "drafting off: --no-draft", "drafts": 0, "draft_tokens": 0,
                          "accepted_tokens": 0}  # fmt: skip
        ask = {"prompt": PROMPT, "max_tokens": 6, **SEEDED}
        status, body, _ = proc.request("POST", "/v1/completions", ask)
        assert status == 200 and body["usage"]["tfc_draft"]["drafts"] == 0
        want = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=6, **SEEDED)
        assert body["choices"][0]["token_sha"] == want.choices[0].token_sha
    assert "drafting off: --no-draft" in log.read_text()
