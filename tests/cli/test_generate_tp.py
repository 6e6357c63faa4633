"""`tfc generate` and `tfc load` on TP=2 and TP=4 images: N rank processes over gloo, TP=1's tokens, refusals in one line.

Each run starts real rank processes (tfc's own launcher, or the torchrun variables set by hand); on a 2-core box a
TP=4 world is 4 processes, so prompts and token counts stay small and every process has a timeout.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from support.server import free_port
from support.tp_images import prepare_worlds

from tfc.cli import cli

pytestmark = pytest.mark.slow

PROMPT = "The model reads the prompt"
SEEDED = ["--temperature", "0.8", "--top-p", "0.9", "--seed", "7"]


@pytest.fixture(scope="module")
def images(tiny_pack, tmp_path_factory):
    return prepare_worlds(tiny_pack, tmp_path_factory.mktemp("gen-tp"))


def _generate(image: str, *args: str) -> dict:
    result = CliRunner().invoke(
        cli, ["generate", image, "--prompt", PROMPT, "--max-tokens", "6", "--json", "--device", "cpu", *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tp1(images):
    """TP=1's replies, greedy, seeded and chat."""
    return {args: _generate(images[1], *args) for args in ((), tuple(SEEDED), ("--chat",))}


@pytest.mark.parametrize("world", [2, 4])
def test_tp_generate_prints_tp1_tokens(images, tp1, world):
    for args in (tuple(SEEDED),) if world == 4 else tp1:  # TP=4: the seeded reply (greedy and chat: TP=2)
        one, many = tp1[args], _generate(images[world], *args)
        assert many["token_sha"] == one["token_sha"] and many["tokens"] == one["tokens"]
        # the warm-up step, the prefill, then a step per token but the last
        assert many["tp"]["world"] == world and many["tp"]["steps"] == 7
        assert many["tp"]["collectives"]["calls"] > 0 and "tp" not in one


@pytest.fixture(scope="module")
def fast1(images):
    """TP=1's fast-forward replies computed as a world computes them (build_fast's tp_exact), greedy and seeded."""
    from tfc.runtime.models.dsv41.fast import build

    with pytest.MonkeyPatch.context() as mp:  # tfc generate builds its runner through build.build_fast
        mp.setattr(build, "build_fast", functools.partial(build.build_fast, tp_exact=True))
        return {args: _generate(images[1], "--fast", *args) for args in ((), tuple(SEEDED))}


@pytest.mark.parametrize("world", [2, 4])
def test_tp_fast_forward_prints_tp1_tokens(images, fast1, world):
    for args in ((), tuple(SEEDED)) if world == 2 else (tuple(SEEDED),):
        one, many = fast1[args], _generate(images[world], "--fast", *args)
        assert one["runner"] == many["runner"] == "fast"
        assert many["token_sha"] == one["token_sha"] and many["tokens"] == one["tokens"]
        assert many["tp"]["world"] == world and many["tp"]["collectives"]["calls"] > 0


def test_tp_load_boots_every_rank_and_reports_each(images):
    result = CliRunner().invoke(cli, ["load", images[2], "--json", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output.strip().splitlines()[-1])
    assert (
        out["world"] == 2
        and [r["rank"] for r in out["ranks"]] == [0, 1]
        and len(out["settings_digest"]) == 64
    )
    assert out["world_resident_s"] >= max(r["wall_ms"] for r in out["ranks"]) / 1e3
    solo = CliRunner().invoke(cli, ["load", images[2], "--rank", "1", "--json", "--device", "cpu"])
    assert solo.exit_code == 0 and json.loads(solo.output.strip().splitlines()[-1])["rank"] == 1


def _rank(
    image: str, rank: int, world: int, port: int, *args: str, as_json: bool = True, env: dict | None = None
) -> subprocess.Popen:
    """One rank started by hand, as torchrun would start it (`env`: settings of this rank's own)."""
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "TORCH_CPP_LOG_LEVEL": "ERROR", **(env or {})}  # fmt: skip
    cmd = [sys.executable, "-m", "tfc", "generate", image, "--prompt", PROMPT, "--device", "cpu", *args]
    cmd += ["--json"] if as_json else []
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ranks_started_like_torchrun_join_and_print_tp1_tokens(images, tp1):
    port = free_port()
    procs = [_rank(images[2], r, 2, port, "--max-tokens", "4") for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[1][0] == "" and json.loads(outs[0][0])["tokens"] == tp1[()]["tokens"][:4]


def test_a_settings_mismatch_between_ranks_is_refused_at_start_in_one_line(images):
    port = free_port()
    procs = [_rank(images[2], 0, 2, port), _rank(images[2], 1, 2, port, "--dtype", "float64")]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2]
    lines = outs[0][1].strip().splitlines()
    assert lines == ['tfc: error: ranks disagree on dtype: rank 0 has "float32", rank 1 has "float64"; '
                     "start every rank with the same image and options"]  # fmt: skip
    assert outs[1][1].strip() == ""  # rank 0 speaks for the world


def test_an_operator_setting_that_differs_between_ranks_is_refused_by_name(images):
    port = free_port()
    procs = [_rank(images[2], 0, 2, port), _rank(images[2], 1, 2, port, env={"TFC_GRAPHS_MAX": "5"})]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [2, 2]
    assert outs[0][1].strip().splitlines() == [
        "tfc: error: ranks disagree on runtime.max_graphs: rank 0 has 48, rank 1 has 5; "
        "start every rank with the same image and options"
    ]


def test_a_rank_that_hangs_takes_the_world_down_with_exit_70(images):
    port = free_port()
    hang = {
        "TFC_TP_HANG_S": "2.5"
    }  # the heartbeat's patience reaches the monitor through the command's options
    procs = [
        _rank(images[2], r, 2, port, "--max-tokens", "400", "--ignore-eos", as_json=False, env=hang)
        for r in range(2)
    ]
    try:
        procs[0].stdout.read(1)  # rank 0 streams its first token: both ranks are generating
        procs[1].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        procs[0].wait(timeout=30)
        assert time.monotonic() - stopped < 5.5  # TFC_TP_HANG_S and the exit
        assert procs[0].returncode == 70
        assert "rank 1 stopped answering (2.5 s without a heartbeat)" in procs[0].stderr.read()
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait()


def test_a_rank_folder_of_a_tp_image_is_refused(images):
    result = subprocess.run(
        [sys.executable, "-m", "tfc", "generate", str(Path(images[2]) / "rank1"), "--prompt", "x", "--device", "cpu"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    says = "one rank folder of a TP=2 image"
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1
