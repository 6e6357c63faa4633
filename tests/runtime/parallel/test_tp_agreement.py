"""What a rank reads and compares before it boots: launcher variables, settings, the command line each rank reruns."""

from __future__ import annotations

import click
import pytest
from tfc.runtime.graphs.graph_cache import GraphSettings
from tfc.runtime.options import RuntimeOptions
from tfc.runtime.parallel.agreement import _first_difference, rank_settings
from tfc.runtime.parallel.env import RankEnvError, rank_env, since_launch
from tfc.runtime.parallel.launch import rank_environ

from tfc.cli.generate_cmd import generate
from tfc.cli.world_cmd import argv_of
from tfc.settings import SettingError

TORCHRUN = {
    "RANK": "1",
    "WORLD_SIZE": "2",
    "LOCAL_RANK": "1",
    "MASTER_ADDR": "10.0.0.1",
    "MASTER_PORT": "29500",
}


def test_launcher_variables_are_read_as_torchrun_sets_them():
    env = rank_env(TORCHRUN)
    assert (env.rank, env.world, env.local_rank) == (1, 2, 1)
    assert (env.master_addr, env.master_port) == ("10.0.0.1", 29500)
    assert not env.launched and env.run_id == "10.0.0.1:29500.0"
    assert rank_env({}) is None and rank_env({**TORCHRUN, "WORLD_SIZE": "1", "RANK": "0"}) is None


def test_tfcs_launcher_gives_its_ranks_the_launcher_contract_and_no_option():
    """A rank tfc starts gets the torchrun variables, its run id and launch time; its options come on its
    command line (and its operator's settings from the environment it shares with the launcher)."""
    env = rank_environ({}, 1, 2, 29501, "0123abcd4567")
    mine = rank_env(env)
    assert mine.launched and mine.run_id == "0123abcd4567.0" and (mine.rank, mine.world) == (1, 2)
    assert 0 <= since_launch(env) < 60
    assert {k for k in env if k.startswith("TFC_")} == {"TFC_LAUNCHER", "TFC_LAUNCH_T0"}
    assert (
        rank_environ({"TFC_LAUNCH_T0": "12.5"}, 0, 2, 29501, "r")["TFC_LAUNCH_T0"] == "12.5"
    )  # a benchmark's
    with pytest.raises(SettingError, match="TFC_LAUNCH_T0"):
        since_launch({"TFC_LAUNCH_T0": "yesterday"})


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"RANK": "2"}, "RANK=2"),
        ({"MASTER_PORT": "x"}, "MASTER_PORT"),
        ({"MASTER_ADDR": ""}, "MASTER_ADDR"),
        ({"LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK=5"),
    ],
)
def test_bad_launcher_variables_are_one_line_naming_them(change, named):
    with pytest.raises(RankEnvError, match=named):
        rank_env({**TORCHRUN, **change})


def test_the_first_difference_is_named_with_both_values():
    base = {"tfc": "0.1.0", "world": 2, "image": "ab" * 32, "dtype": "float32", "graphs.max_graphs": 0}
    assert _first_difference([base, dict(base)]) is None
    line = _first_difference([base, {**base, "dtype": "float64"}])
    assert line.startswith('ranks disagree on dtype: rank 0 has "float32", rank 1 has "float64"')
    assert "\n" not in line
    assert "graphs.max_graphs" in _first_difference([base, dict(base), {**base, "graphs.max_graphs": 48}])
    assert _first_difference([base, {"error": "no rank 1"}]) == "rank 1 cannot start: no rank 1"


def test_a_rank_reads_its_own_manifest_and_refuses_another_world(tp_images):
    mine = rank_settings(tp_images[2], 1, 2, "generate", dtype="float32", graphs=GraphSettings(max_graphs=0))
    assert mine["world"] == 2 and mine["command"] == "generate" and len(mine["image"]) == 64
    assert mine["graphs.max_graphs"] == 0 and "graphs.buckets" in mine
    assert rank_settings(tp_images[2], 0, 2, "generate")["image"] == mine["image"]
    assert "error" in rank_settings(tp_images[2], 1, 4, "generate")
    assert "rank 3" in rank_settings(tp_images[2], 3, 4, "generate")["error"]


def test_the_runtime_options_are_compared_field_by_field(tp_images):
    """A flag or an operator's setting that differs on one rank is refused by name, even where it changes
    nothing on this device (graphs are off on the CPU either way)."""
    every = [
        rank_settings(tp_images[2], rank, 2, "load", runtime=RuntimeOptions.from_settings(env=env))
        for rank, env in ((0, {}), (1, {"TFC_GRAPHS_MAX": "5"}))
    ]
    assert every[0]["runtime.max_graphs"] == 48 and every[0]["runtime.tp_hang_s"] == 4.0
    assert _first_difference(every).startswith(
        "ranks disagree on runtime.max_graphs: rank 0 has 48, rank 1 has 5"
    )
    flags = [rank_settings(tp_images[2], r, 2, "load", runtime=RuntimeOptions(graphs=r == 0)) for r in (0, 1)]
    assert _first_difference(flags).startswith("ranks disagree on runtime.graphs: rank 0 has true")


def test_every_rank_reruns_the_command_line_it_was_given():
    argv = ["IMG", "--prompt", "a b", "--max-tokens", "3", "--temperature", "0.8", "--seed", "7", "--chat",
            "--device", "cpu", "-j", "2", "--json"]  # fmt: skip
    ctx = generate.make_context("generate", list(argv))
    again = generate.make_context("generate", argv_of(ctx)[1:])
    assert argv_of(ctx)[0] == "generate" and again.params == ctx.params
    assert "--jobs" in argv_of(ctx) and "--chat" in argv_of(ctx) and "--tokenizer" not in argv_of(ctx)
    assert isinstance(generate, click.Command)
