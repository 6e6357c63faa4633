"""`tfc bench URL`: percentiles, prompts and datasets, the Poisson schedule, stream timing against a scripted
server, failure counting, one-line refusals, and a sweep against the real `tfc serve`."""

from __future__ import annotations

import asyncio
import json
import math
import random
import subprocess
import sys
import tempfile

import httpx2
import numpy as np
import pytest
from support.fake_openai import PAUSE_S, FakeOpenAI
from support.server import ServerProcess, free_port

from tfc.bench import BenchError
from tfc.bench.client import Outcome, RequestShape, base_url, stream_one
from tfc.bench.load import parse_concurrency, parse_rates, poisson_offsets, sweep
from tfc.bench.prompts import WORDS, PromptSource, load_dataset
from tfc.bench.stats import percentile, summarise
from tfc.cli import main

KEYS = {
    "requests",
    "ok",
    "failed",
    "duration_s",
    "output_tok_s",
    "request_s",
    "ttft_ms",
    "tpot_ms",
    "itl_ms",
    "errors",
}


# --- percentiles and summaries


@pytest.mark.parametrize("n", [1, 2, 3, 10, 101])
def test_percentiles_interpolate_linearly_as_numpy_does(n):
    rng = np.random.default_rng(n)
    values = list(rng.exponential(size=n))
    for q in (0, 1, 25, 50, 90, 99, 99.9, 100, *rng.uniform(0, 100, size=10)):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q), rel=1e-12, abs=1e-15)
    assert percentile([], 50) is None


def test_summary_counts_rates_and_the_first_distinct_errors():
    good = [Outcome(ok=True, latency_s=1.0, ttft_s=0.2, output_tokens=5, itl_s=(0.1, 0.3)) for _ in range(3)]
    bad = [Outcome(ok=False, latency_s=0.1, error=f"e{i % 7}") for i in range(20)]
    out = summarise({"concurrency": 2}, good + bad, duration_s=2.0)
    assert out["concurrency"] == 2 and out["requests"] == 23 and out["ok"] == 3 and out["failed"] == 20
    assert out["output_tokens"] == 15 and out["output_tok_s"] == 7.5 and out["request_s"] == 1.5
    assert out["ttft_ms"] == {"p50": 200.0, "p90": 200.0, "p99": 200.0}
    assert out["tpot_ms"]["p50"] == pytest.approx(200.0)  # (1.0 - 0.2) / (5 - 1)
    assert out["itl_ms"]["p50"] == pytest.approx(200.0)  # the gaps 0.1 and 0.3, three times over
    assert out["errors"] == ["e0", "e1", "e2", "e3", "e4"]
    empty = summarise({"rate": "inf"}, bad, 1.0)
    assert empty["ttft_ms"] == {"p50": None, "p90": None, "p99": None} and empty["output_tok_s"] == 0


def test_tpot_needs_two_tokens():
    assert Outcome(ok=True, latency_s=1.0, ttft_s=0.4, output_tokens=4).tpot_s == pytest.approx(0.2)
    assert Outcome(ok=True, latency_s=1.0, ttft_s=0.4, output_tokens=1).tpot_s is None


# --- prompts and datasets


def test_synthetic_prompts_are_seeded_word_counts_that_never_repeat():
    source = PromptSource(seed=3, input_words=12)
    prompts = source.take(50) + source.take(50)
    assert all(len(p.split()) == 12 and set(p.split()) <= set(WORDS) for p in prompts)
    assert len(set(prompts)) == 100
    assert PromptSource(seed=3, input_words=12).take(100) == prompts
    assert PromptSource(seed=4, input_words=12).take(1) != prompts[:1]


def test_a_dataset_cycles_through_a_seeded_shuffle(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"prompt": f"p{i}", "other": i}) + "\n\n" for i in range(7)))
    prompts = load_dataset(path)
    assert prompts == [f"p{i}" for i in range(7)]
    taken = PromptSource(seed=1, input_words=5, dataset=prompts).take(21)
    for cycle in range(3):
        assert sorted(taken[7 * cycle : 7 * cycle + 7]) == sorted(prompts)
    assert taken[:7] != prompts or taken[7:14] != prompts  # shuffled, not in file order


def test_sharegpt_takes_each_conversations_first_human_turn(tmp_path):
    path = tmp_path / "sharegpt.json"
    conversations = [
        {
            "id": "a",
            "conversations": [{"from": "human", "value": "first"}, {"from": "gpt", "value": "reply"}],
        },
        {
            "id": "b",
            "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "second"}],
        },
        {"id": "c", "conversations": [{"from": "gpt", "value": "only a reply"}]},  # skipped
        {"prompt": "third"},
    ]
    path.write_text(json.dumps(conversations, indent=1))
    assert load_dataset(path) == ["first", "second", "third"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"prompt": "a"}\n{"prompt": \n', "line 2 is not JSON"),
        ('{"prompt": "a"}\n{"text": "b"}\n', "line 2 has neither"),
        ('[{"prompt": "a"}, 3]', "item 1 has neither"),
        ("[1, 2", "not valid JSON"),
        ("\n\n", "no prompts"),
        ('[{"conversations": []}]', "no prompts"),
    ],
)
def test_a_dataset_that_does_not_parse_is_refused(tmp_path, text, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(BenchError, match=message):
        load_dataset(path)


# --- settings and the schedule


def test_poisson_arrivals_have_exponential_gaps_of_mean_one_over_the_rate():
    offsets = poisson_offsets(20_000, 8.0, random.Random(5))
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / 8, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(
        1.0, rel=0.05
    )  # an exponential's coefficient of variation
    assert np.mean(gaps < np.log(2) / 8) == pytest.approx(0.5, abs=0.02)  # its median is ln 2 / rate
    assert poisson_offsets(50, 8.0, random.Random(5)) == offsets[:50]
    assert poisson_offsets(4, math.inf, random.Random(5)) == [0.0] * 4


def test_sweep_lists_and_default_request_counts():
    assert parse_concurrency("1, 4,16,64") == [1, 4, 16, 64]
    assert parse_rates("0.5,2,inf") == [0.5, 2.0, math.inf]
    for bad in ("1,,2", "a", "0", "-1", "1.5", "10001"):
        with pytest.raises(ValueError):
            parse_concurrency(bad)
    for bad in ("0", "-2", "nan", "x", "1e999", ""):
        with pytest.raises(ValueError):
            parse_rates(bad)
    assert [(s.value, s.requests) for s in sweep([1, 32], None, None)] == [(1, 64), (32, 128)]
    assert [(s.value, s.requests) for s in sweep(None, None, 7)] == [(1, 7), (4, 7), (16, 7), (64, 7)]
    assert [s.key() for s in sweep(None, [2.0, math.inf], None)] == [{"rate": 2.0}, {"rate": "inf"}]


def test_urls_are_reduced_to_the_server_root():
    assert base_url("localhost:8000") == "http://localhost:8000"
    assert base_url("http://h:8000/v1/") == "http://h:8000"
    assert base_url("https://h/proxy/v1") == "https://h/proxy"
    for bad in ("ftp://h", "http://", "http://[::1", "http://h:99999"):
        with pytest.raises(BenchError):
            base_url(bad)


# --- one streamed request against the scripted server


def _stream(server: FakeOpenAI, prompt: str, endpoint: str = "completions", timeout_s: float = 30) -> Outcome:
    shape = RequestShape(endpoint, "fake", 4)
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"

    async def go():
        async with httpx2.AsyncClient() as client:
            return await stream_one(client, server.url + path, shape.body(prompt), timeout_s)

    return asyncio.run(go())


def test_a_stream_is_timed_from_its_token_chunks_and_counted_from_its_usage():
    with FakeOpenAI() as server:
        slow = _stream(server, "slow")
        plain = _stream(server, "no-usage")
        chat = _stream(server, "slow", "chat")
        body = server.bodies[0]
    assert body["stream"] and body["stream_options"] == {"include_usage": True} and "ignore_eos" not in body
    for outcome in (slow, chat):
        assert outcome.ok and outcome.output_tokens == 5  # the usage frame's count, not the 3 chunks
        assert outcome.ttft_s >= PAUSE_S and len(outcome.itl_s) == 2  # the role-only chat chunk carries none
        assert min(outcome.itl_s) >= PAUSE_S / 2 and outcome.latency_s >= outcome.ttft_s + sum(outcome.itl_s)
    assert plain.ok and plain.output_tokens == 3  # no usage: one token a chunk


@pytest.mark.parametrize(
    ("prompt", "error"),
    [("http-500", "HTTP 500: scripted failure"), ("stream-error", "stream error: generation failed"),
     ("cut", "stream ended before [DONE]")],
)  # fmt: skip
def test_a_failed_stream_is_an_outcome_not_an_exception(prompt, error):
    with FakeOpenAI() as server:
        outcome = _stream(server, prompt)
    assert not outcome.ok and outcome.error.startswith(error)


def test_a_request_past_the_timeout_fails():
    with FakeOpenAI() as server:
        outcome = _stream(server, "slow", timeout_s=PAUSE_S / 2)
    assert not outcome.ok and "within" in outcome.error


# --- the command, in process


def _bench(capsys, monkeypatch, *args: str) -> tuple[int, list[dict], list[str]]:
    """(exit code, JSON lines on stdout, stderr lines) of `tfc bench ARGS --json`."""
    monkeypatch.setattr(sys, "argv", ["tfc", "bench", *args, "--json"])
    code = 0
    try:
        main()
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err.splitlines()


def test_failed_requests_are_counted_and_the_run_goes_on(capsys, monkeypatch):
    with FakeOpenAI(fail_every=2) as server:
        code, results, _ = _bench(capsys, monkeypatch, server.url, "--concurrency", "1,3", "--requests", "6",
                                  "--input-len", "3", "--ignore-eos")  # fmt: skip
        assert all(body["ignore_eos"] is True and len(body["prompt"].split()) == 3 for body in server.bodies)
    assert code == 0
    assert [r["concurrency"] for r in results] == [1, 3]
    for r in results:
        assert r.keys() >= KEYS and r["requests"] == 6 and r["ok"] == 3 and r["failed"] == 3
        assert r["output_tokens"] == 15 and r["errors"][0].startswith("HTTP 500: scripted failure")


def test_a_run_where_nothing_succeeds_exits_1(capsys, monkeypatch):
    with FakeOpenAI(fail_every=1) as server:
        code, results, err = _bench(capsys, monkeypatch, server.url, "--rate", "inf", "--requests", "3")
    assert code == 1 and results[0]["failed"] == 3 and results[0]["rate"] == "inf"
    assert err[-1] == "tfc bench: no request succeeded"


def test_the_key_comes_from_the_option_or_openai_api_key(capsys, monkeypatch):
    with FakeOpenAI(key="sesame") as server:
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        code, _, err = _bench(capsys, monkeypatch, server.url, "--requests", "1", "--concurrency", "1")
        assert code == 2 and len(err) == 1 and "--api-key or set OPENAI_API_KEY" in err[0]
        monkeypatch.setenv("OPENAI_API_KEY", "sesame")
        code, results, _ = _bench(capsys, monkeypatch, server.url, "--requests", "1", "--concurrency", "1")
        assert code == 0 and results[0]["ok"] == 1


def _refused(capsys, monkeypatch, *args: str) -> str:
    code, _, err = _bench(capsys, monkeypatch, *args)
    assert code == 2 and len(err) == 1 and err[0].startswith("tfc: error: "), err
    return err[0]


def test_bad_input_is_one_line_and_exit_2(capsys, monkeypatch, tmp_path):
    assert "cannot reach" in _refused(capsys, monkeypatch, f"http://127.0.0.1:{free_port()}")
    with FakeOpenAI() as server:
        assert "answered HTTP 404" in _refused(capsys, monkeypatch, server.url + "/elsewhere")
        assert "does not serve 'other'" in _refused(capsys, monkeypatch, server.url, "--model", "other")
        assert "'--concurrency'" in _refused(capsys, monkeypatch, server.url, "--concurrency", "1,x")
        assert "'--rate'" in _refused(capsys, monkeypatch, server.url, "--rate", "0")
        assert "exclude" in _refused(capsys, monkeypatch, server.url, "--rate", "1", "--concurrency", "1")
        assert "'--dataset'" in _refused(capsys, monkeypatch, server.url, "--dataset", str(tmp_path / "none"))
        (tmp_path / "bad.jsonl").write_text("{oops\n")
        assert "line 1 is not JSON" in _refused(
            capsys, monkeypatch, server.url, "--dataset", str(tmp_path / "bad.jsonl")
        )
        assert server.bodies == []  # every refusal came before the first request
    assert "not an http" in _refused(capsys, monkeypatch, "ftp://127.0.0.1")


# --- against the real server


@pytest.fixture(scope="module")
def tiny_server(tiny_image, tmp_path_factory):
    log = tmp_path_factory.mktemp("bench-serve") / "serve.log"
    with ServerProcess(tiny_image, "--max-seqs", "4", "--model-name", "tiny", log=log) as server:
        yield server


def _bench_process(url: str, *args: str) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "tfc",
        "bench",
        url,
        "--input-len",
        "8",
        "--output-len",
        "4",
        "--json",
        *args,
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tempfile.gettempdir())
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


@pytest.mark.slow
def test_a_sweep_against_tfc_serve_reports_every_key(tiny_server):
    results = _bench_process(tiny_server.url, "--concurrency", "1,2", "--requests", "4")
    assert [r["concurrency"] for r in results] == [1, 2]
    for r in results:
        assert r.keys() >= KEYS and r["model"] == "tiny", r
        assert r["ok"] == r["requests"] == 4 and r["failed"] == 0 and r["errors"] == []
        assert r["output_tok_s"] > 0 and r["request_s"] > 0 and r["duration_s"] > 0
        assert 0 < r["ttft_ms"]["p50"] <= r["ttft_ms"]["p90"] <= r["ttft_ms"]["p99"]
        assert all(set(r[k]) == {"p50", "p90", "p99"} for k in ("ttft_ms", "tpot_ms", "itl_ms"))
    chat = _bench_process(tiny_server.url + "/v1", "--endpoint", "chat", "--rate", "inf", "--requests", "3",
                          "--ignore-eos")  # fmt: skip
    assert chat[0]["rate"] == "inf" and chat[0]["ok"] == 3
    assert chat[0]["output_tokens"] == 3 * 4  # ignore_eos: every reply runs to max_tokens, counted by usage
