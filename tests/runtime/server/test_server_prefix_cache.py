"""`tfc serve` with the prefix cache, through the official openai client: a second chat turn resumes from the first
one's states (usage.prompt_tokens_details.cached_tokens) and replies as a server without the cache does, from
the device, host and disk tiers; /health and /metrics say what the cache holds."""

from __future__ import annotations

import re

import pytest
from support.server import ServerProcess

FLAGS = {
    "off": ["--no-prefix-cache"],
    "device": [],
    "host": ["--prefix-cache-gib", "0", "--host-cache-gib", "1"],
    "disk": ["--prefix-cache-gib", "0", "--disk-cache"],  # + the folder
}
TURN1 = [{"role": "user", "content": "Hello there, how are you today?"}]
SEEDED = {"temperature": 1.0, "top_p": 0.9, "seed": 3}


@pytest.fixture(scope="module")
def servers(served_image, tmp_path_factory):
    """One server per tier (and one without the cache), booted side by side."""
    logs, disk = tmp_path_factory.mktemp("prefix-logs"), tmp_path_factory.mktemp("prefix-disk")
    procs = {}
    for name, flags in FLAGS.items():
        args = [*flags, str(disk)] if name == "disk" else flags
        procs[name] = ServerProcess(
            served_image, "--prefill-chunk", "8", "--max-seqs", "4", "--model-name", "tiny", *args,
            log=logs / f"{name}.log",
        )  # fmt: skip
    procs["disk"].folder = disk
    try:
        for proc in procs.values():
            proc.wait_ready()
        yield procs
    finally:
        for proc in procs.values():
            proc.signal()  # all drain at once
        for proc in procs.values():
            proc.stop()
    assert not list(disk.glob("*.tfcprefix"))  # the disk tier's files go with its server


def _client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _conversation(server, seeded: bool = False):
    """(turn 1, turn 2 greedy[, turn 2 seeded]) replies of one conversation."""
    client = _client(server)
    first = client.chat.completions.create(model="tiny", messages=TURN1, max_tokens=6, temperature=0)
    turn2 = [*TURN1, {"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "Tell me more."}]  # fmt: skip
    again = [{"temperature": 0}, SEEDED] if seeded else [{"temperature": 0}]
    return [first] + [
        client.chat.completions.create(model="tiny", messages=turn2, max_tokens=6, **kw) for kw in again
    ]


@pytest.fixture(scope="module")
def fresh(servers):
    """The conversation on the server without a prefix cache."""
    replies = _conversation(servers["off"], seeded=True)
    assert all(r.usage.prompt_tokens_details.cached_tokens == 0 for r in replies)
    return replies


def _metric(server, name: str, **labels) -> float:
    _, text, _ = server.get("/metrics")
    want = {"model_name": "tiny", **labels}
    for line in text.splitlines():
        m = re.fullmatch(rf"tfc:{name}(?:\{{(.*)\}})? (\S+)", line)
        if m and dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or "")) == want:
            return float(m.group(2))
    return 0.0


@pytest.mark.parametrize("tier", ["device", "host", "disk"])
def test_a_second_turn_resumes_from_the_first_and_replies_as_fresh(servers, fresh, tier):
    server = servers[tier]
    replies = _conversation(server, seeded=tier == "device")
    first, second = replies[0], replies[1]
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    for got, want in zip(replies, fresh, strict=False):
        assert got.choices[0].message.content == want.choices[0].message.content
        assert got.choices[0].token_sha == want.choices[0].token_sha
        assert got.usage.prompt_tokens == want.usage.prompt_tokens
    assert _metric(server, "prefix_cache_tier_hits_total", tier=tier) >= 1
    assert _metric(server, "cached_tokens_total") >= second.usage.prompt_tokens_details.cached_tokens
    assert _metric(server, "prefix_cache_hits_total") > 0
    assert _metric(server, "prefix_cache_queries_total") > 0
    assert _metric(server, "prefix_cache_bytes", tier=tier) > 0
    health = server.get("/health")[1]["prefix_cache"]
    assert health["on"] and health["pinned"] == 0 and health["tiers"][tier]["entries"] > 0
    if tier == "disk":
        assert len(list(server.folder.glob("*.tfcprefix"))) == health["tiers"]["disk"]["entries"]


def test_a_streamed_completion_reports_its_cached_tokens(servers):
    client = _client(servers["device"])
    ids = [0, 297, 315, 522, 363, 331, 265, 317, 518, 300, 301, 302, 303, 304, 305, 306, 307, 308]
    runs = []
    for prompt in (ids[:11], ids):
        chunks = list(client.completions.create(
            model="tiny", prompt=prompt, max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True},
        ))  # fmt: skip
        runs.append((chunks[-1].usage, [c for c in chunks if c.choices and c.choices[0].finish_reason]))
    assert runs[0][0].prompt_tokens_details.cached_tokens == 0
    assert runs[1][0].prompt_tokens_details.cached_tokens == 11  # the first prompt's end
    fresh = _client(servers["off"]).completions.create(model="tiny", prompt=ids, max_tokens=4, temperature=0)
    assert runs[1][1][0].choices[0].token_sha == fresh.choices[0].token_sha


def test_health_and_the_boot_log_say_whether_the_cache_is_on(servers):
    off = servers["off"].get("/health")[1]["prefix_cache"]
    assert off == {"on": False, "note": "prefix cache off"}
    assert "prefix cache off" in servers["off"].output()
    assert "prefix cache on: a state every 8 tokens" in servers["host"].output()
    assert servers["host"].get("/health")[1]["prefix_cache"]["tiers"]["device"]["budget"] == 0


@pytest.mark.parametrize("args", [["--disk-cache", "FILE"], ["--host-cache-gib", "-1"]], ids=" ".join)
def test_a_bad_cache_option_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, args):
    import sys

    from tfc.cli import main

    (tmp_path / "FILE").write_text("")
    args = [str(tmp_path / a) if a == "FILE" else a for a in args]
    monkeypatch.setattr(sys, "argv", ["tfc", "serve", str(tmp_path), *args])
    with pytest.raises(SystemExit) as done:
        main()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert done.value.code == 2 and len(lines) == 1 and lines[0].startswith("tfc: error: ")
