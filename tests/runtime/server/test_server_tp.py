"""`tfc serve` on TP=2 and TP=4 images through the official openai client: TP=1's tokens, drain, a killed rank.

Every server is a real launcher with its rank processes (gloo on the CPU); `server` (conftest) is the TP=1 one.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import pytest
from support.server import ServerProcess
from support.tp_images import prepare_worlds

pytestmark = pytest.mark.slow

ASKS = [
    {"prompt": "The model reads the prompt", "max_tokens": 6, "temperature": 0},
    {"prompt": "Hello", "max_tokens": 5, "temperature": 0.9, "top_p": 0.9, "seed": 11},
    {
        "prompt": "Hello",
        "max_tokens": 5,
        "temperature": 0.9,
        "seed": 12,
        "frequency_penalty": 1.0,
        "logit_bias": {"7": 3},
    },
]
CHAT = {"messages": [{"role": "user", "content": "Hi there"}], "max_tokens": 5, "temperature": 0}


@pytest.fixture(scope="module")
def tp_images(tiny_pack, tmp_path_factory):
    return prepare_worlds(tiny_pack, tmp_path_factory.mktemp("serve-tp"), (2, 4))


def _client(proc: ServerProcess):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=proc.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _shas(client) -> list[str]:
    out = [client.completions.create(model="tiny", **ask).model_extra["token_sha"] for ask in ASKS]
    out.append(client.chat.completions.create(model="tiny", **CHAT).model_extra["token_sha"])
    echo = client.completions.create(model="tiny", echo=True, logprobs=2, **ASKS[0]).choices[0].logprobs
    out.append(echo.token_logprobs)  # the prompt's logprobs too
    stream = client.completions.create(model="tiny", stream=True, **ASKS[0])
    out.append(
        [c for c in stream if c.choices and c.choices[0].finish_reason][-1]
        .choices[0]
        .model_extra["token_sha"]
    )
    return out


def _pids(proc: ServerProcess) -> dict[int, int]:
    return {int(r): int(p) for r, p in re.findall(r"rank (\d+) pid (\d+)", proc.output())}


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("world", [2, 4])
def test_tp_serve_answers_with_tp1_tokens_and_drains_every_rank(server, tp_images, tmp_path, world):
    want = _shas(_client(server))
    proc = ServerProcess(tp_images[world], "--max-seqs", "4", "--model-name", "tiny", log=tmp_path / "tp.log")
    with proc:
        assert _shas(_client(proc)) == want
        pids = _pids(proc)
        assert sorted(pids) == list(range(world))
    assert proc.proc.returncode == 0, proc.output()  # SIGTERM to the launcher: rank 0 drains, the rest follow
    assert not any(_alive(p) for p in pids.values())


@pytest.mark.parametrize("victim", [1, 0])
def test_a_killed_rank_ends_the_stream_with_an_error_and_every_rank_within_5_s(tp_images, tmp_path, victim):
    proc = ServerProcess(tp_images[2], "--max-seqs", "4", "--model-name", "tiny", log=tmp_path / "kill.log")
    with proc:
        pids = _pids(proc)
        client = _client(proc)
        stream = client.completions.create(
            model="tiny", prompt="Hello", max_tokens=400, temperature=0, stream=True
        )
        chunks, error, killed = 0, None, None
        try:
            for _ in stream:
                chunks += 1
                if chunks == 2:
                    os.kill(pids[victim], signal.SIGKILL)
                    killed = time.monotonic()
        except Exception as e:  # the openai client raises on an in-stream error event or a cut connection
            error = e
        assert killed is not None and error is not None and chunks < 400
        if victim == 1:  # rank 0 is alive to say why: an in-stream error naming the lost rank
            assert "rank 1 was killed" in str(error)
        proc.proc.wait(timeout=10)
        assert time.monotonic() - killed < 5.0
        assert proc.proc.returncode == 70
        assert not any(_alive(p) for p in pids.values())


def test_a_request_in_flight_finishes_when_the_launcher_is_told_to_stop(tp_images, tmp_path):
    proc = ServerProcess(tp_images[2], "--max-seqs", "4", "--model-name", "tiny", log=tmp_path / "drain.log")
    with proc:
        pids = _pids(proc)
        client = _client(proc)
        done: dict = {}

        def ask() -> None:
            done["reply"] = client.completions.create(
                model="tiny", prompt="Hello", max_tokens=24, temperature=0
            )

        asking = threading.Thread(target=ask)
        asking.start()
        time.sleep(1.0)
        proc.signal(signal.SIGTERM)
        asking.join(60)
        assert done["reply"].choices[0].finish_reason == "length"
        proc.proc.wait(timeout=30)
        log = proc.output()
    assert proc.proc.returncode == 0 and "draining" in log and "stopped" in log
    assert not any(_alive(p) for p in pids.values())
