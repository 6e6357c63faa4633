"""Bad requests get a 400 naming the field (and the server goes on); keys, unknown routes and models refused."""

from __future__ import annotations

import os
import stat

import pytest
from support.server import ServerProcess

OK = {"model": "tiny", "prompt": "Hello", "max_tokens": 2, "temperature": 0}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**OK, "max_tokens": 10**9}, "messages"),
        ({**OK, "max_tokens": 0}, "max_tokens"),
        ({**OK, "temperature": -1}, "temperature"),
        ({**OK, "top_p": 0}, "top_p"),
        ({**OK, "n": 0}, "n"),
        ({**OK, "seed": -3}, "seed"),
        ({**OK, "frobnicate": 1}, "frobnicate"),
        ({**OK, "prompt": [5, 10**7]}, "prompt"),
        ({"model": "tiny", "max_tokens": 2}, "prompt"),
        ({**OK, "presence_penalty": 2.5}, "presence_penalty"),
        ({**OK, "frequency_penalty": -3}, "frequency_penalty"),
        ({**OK, "repetition_penalty": 0}, "repetition_penalty"),
        ({**OK, "logit_bias": {"abc": 1}}, "logit_bias"),
        ({**OK, "logit_bias": {"7": 101}}, "logit_bias.7"),
        ({**OK, "logit_bias": {"640": 1}}, "logit_bias"),
    ],
)
def test_bad_fields_are_400_naming_the_field(server, body, param):
    status, reply, _ = server.request("POST", "/v1/completions", body)
    assert status == 400, reply
    assert reply["error"]["param"] == param and reply["error"]["type"] == "invalid_request_error", reply
    assert server.request("POST", "/v1/completions", OK)[0] == 200  # nothing broke for the next request


def test_context_overflow_says_context_length_exceeded(server):
    status, reply, _ = server.request("POST", "/v1/completions", {**OK, "max_tokens": 5000})
    assert status == 400 and reply["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 4096 tokens" in reply["error"]["message"]


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b"\xff\xfe"])
def test_non_json_bodies_are_400(server, raw):
    status, reply, _ = server.request(
        "POST", "/v1/chat/completions", raw, {"Content-Type": "application/json"}
    )
    assert status == 400 and reply["error"]["type"] == "invalid_request_error", reply
    assert server.request("POST", "/v1/completions", OK)[0] == 200


def test_chat_refusals(server):
    bad_role = {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}
    assert server.request("POST", "/v1/chat/completions", bad_role)[0] == 400
    ends_with_assistant = {"model": "tiny", "messages": [{"role": "user", "content": "x"},
                                                         {"role": "assistant", "content": "y"}]}  # fmt: skip
    status, reply, _ = server.request("POST", "/v1/chat/completions", ends_with_assistant)
    assert status == 400 and reply["error"]["param"] == "messages[1]"
    assert server.request("POST", "/v1/chat/completions", {"model": "tiny", "messages": []})[0] == 400


def test_unknown_model_route_and_method(server):
    status, reply, _ = server.request("POST", "/v1/completions", {**OK, "model": "gpt-9"})
    assert status == 404 and reply["error"]["code"] == "model_not_found"
    status, reply, _ = server.get("/v1/nothing")
    assert status == 404 and reply["error"]["code"] == "not_found"
    assert server.get("/v1/completions")[0] == 405


def test_health_and_metrics(server):
    status, health, _ = server.get("/health")
    assert status == 200 and health["status"] == "ready" and health["slots"] == 16 and "uptime_s" in health
    server.request("POST", "/v1/completions", OK)
    status, text, headers = server.get("/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    for name in ("tfc:requests_total", "tfc:generation_tokens_total", "tfc:prompt_tokens_total",
                 "tfc:num_requests_running", "tfc:num_requests_waiting", "tfc:time_to_first_token_seconds_bucket",
                 "tfc:inter_token_latency_seconds_bucket", "tfc:e2e_request_latency_seconds_bucket",
                 "tfc:kv_cache_usage_perc", "tfc:requests_rejected_total", "tfc:boot_phase_seconds",
                 "tfc:graph_replays", 'model_name="tiny"'):  # fmt: skip
        assert name in text, name


@pytest.mark.slow
def test_api_keys(served_image, tmp_path):
    open_file, key_file = tmp_path / "open-keys", tmp_path / "keys"
    for path, mode in ((open_file, 0o644), (key_file, stat.S_IRUSR | stat.S_IWUSR)):
        path.write_text("ops: k-file\n")
        os.chmod(path, mode)
    # a key file others can read is refused at boot: that server fails while the next one boots
    proc = ServerProcess(served_image, "--api-key-file", str(open_file), log=tmp_path / "log")
    with ServerProcess(served_image, "--api-key", "k-opt", "--api-key-file", str(key_file), "--model-name", "tiny",
                       env={"TFC_API_KEY": "k-env1,k-env2"}, log=tmp_path / "log2") as s:  # fmt: skip
        assert proc.proc.wait(60) == 2 and "chmod 600" in proc.output()
        status, reply, headers = s.request("POST", "/v1/completions", OK)
        assert status == 401 and headers["www-authenticate"].startswith("Bearer")
        assert reply["error"]["type"] == "authentication_error"
        assert s.request("POST", "/v1/completions", OK, {"Authorization": "Bearer wrong"})[0] == 401
        for key in ("k-opt", "k-file", "k-env2"):
            assert s.request("POST", "/v1/completions", OK, {"Authorization": f"Bearer {key}"})[0] == 200
        assert s.request("POST", "/v1/completions", OK, {"x-api-key": "k-env1"})[0] == 200
        assert s.get("/v1/models")[0] == 401 and s.get("/metrics")[0] == 401
        status, health, _ = s.get("/health")  # open without a key, but says little
        assert status == 200 and health == {"status": "ready"}
        assert "slots" in s.get("/health", {"x-api-key": "k-opt"})[1]


@pytest.mark.slow
def test_boot_failure_is_one_line_and_exit_2(tmp_path):
    proc = ServerProcess(tmp_path / "no-such-image", log=tmp_path / "log")
    assert proc.proc.wait(60) == 2
    lines = [x for x in proc.output().splitlines() if x.startswith("tfc: error:")]
    assert len(lines) == 1 and "no-such-image" in lines[0]


@pytest.mark.slow
def test_port_in_use_is_one_line(served_image, server, tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "tfc", "serve", served_image, "--port", str(server.port)],
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("tfc: error: cannot listen")


@pytest.mark.slow
def test_a_tokenizer_file_replaces_the_images_and_a_bad_one_is_one_line(served_image, tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(640)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    words.save(str(tmp_path / "words.json"))
    with ServerProcess(
        served_image, "--tokenizer", str(tmp_path / "words.json"), log=tmp_path / "ok.log"
    ) as s:
        status, out, _ = s.request("POST", "/tokenize", {"prompt": "w7 w300 w5", "add_special_tokens": False})
        assert status == 200 and out["tokens"] == [7, 300, 5], out
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    proc = ServerProcess(served_image, "--tokenizer", str(bad), log=tmp_path / "log")
    assert proc.proc.wait(90) == 2
    lines = [x for x in proc.output().splitlines() if x.startswith("tfc: error:")]
    assert len(lines) == 1 and "not a usable tokenizer.json" in lines[0] and "Traceback" not in proc.output()
