"""One CLI: usage errors are one line (exit 2), options are spelled alike, numbers are range-checked, help ends with an example."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from tfc.cli import cli, main


def _main(capsys, monkeypatch, *args: str) -> tuple[int, list[str]]:
    """Run the real entry point in-process; (exit code, stderr's non-empty lines)."""
    monkeypatch.setattr(sys, "argv", ["tfc", *args])
    with pytest.raises(SystemExit) as done:
        main()
    return done.value.code, [line for line in capsys.readouterr().err.splitlines() if line.strip()]


def _refused(capsys, monkeypatch, *args: str) -> str:
    """The one line a refusal prints (exit 2, no traceback, no usage block)."""
    code, lines = _main(capsys, monkeypatch, *args)
    assert code == 2, lines
    assert len(lines) == 1 and lines[0].startswith("tfc: error: "), lines
    return lines[0]


def _commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    """Every command path of the tree, groups included: ('cache',), ('cache', 'ls'), ..."""
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        yield (*path, name), command
        if isinstance(command, click.Group):
            yield from _commands(command, ctx, (*path, name))


def _help(*path: str) -> str:
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


ALL = [path for path, _ in _commands(cli, click.Context(cli))]


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["nosuch"],
        ["load"],
        ["load", "x", "--jobs", "abc"],
        ["load", "--nope"],
        ["generate"],
        ["generate", "x", "--prompt", "hi", "--device", "gpu"],
        ["cache"],
        ["cache", "nosuch"],
        ["verify", "x", "--jobs"],
        ["serve", "x", "--port", "99999"],
    ],
    ids=" ".join,
)
def test_click_usage_errors_are_one_line_and_exit_2(capsys, monkeypatch, args):
    line = _refused(capsys, monkeypatch, *args)
    assert "Usage:" not in line and "--help" in line


def test_a_step_budget_below_the_prompt_chunk_is_refused(capsys, monkeypatch):
    line = _refused(capsys, monkeypatch, "serve", "x", "--max-step-tokens", "8", "--prefill-chunk", "16")
    assert "'--max-step-tokens': 8 is less than --prefill-chunk 16" in line


def test_a_missing_command_names_the_commands(capsys, monkeypatch):
    assert "inspect, plan, prepare" in _refused(capsys, monkeypatch)
    assert "ls, prune, rm" in _refused(capsys, monkeypatch, "cache")


def test_every_thread_count_is_spelled_jobs():
    counted = set()
    for path, command in _commands(cli, click.Context(cli)):
        text = _help(*path)
        assert "--threads" not in text and "--workers" not in text, (
            path
        )  # load's old spelling parses, unshown
        if "jobs" in {p.name for p in command.params}:
            counted.add(path)
            assert "-j, --jobs N" in text, path
    assert counted >= {
        ("load",),
        ("generate",),
        ("serve",),
        ("verify",),
        ("prepare",),
        ("fixture", "flash-random"),
    }


@pytest.mark.parametrize("value", ["0", "-1", "100000"])
def test_jobs_out_of_range_is_refused_on_every_command(capsys, monkeypatch, tmp_path, value):
    for args in (
        ["prepare", str(tmp_path), "--jobs", value],
        ["load", str(tmp_path), "--jobs", value],
        ["load", str(tmp_path), "--threads", value],  # the old spelling still parses
        ["generate", str(tmp_path), "--prompt", "hi", "-j", value],
        ["serve", str(tmp_path), "--jobs", value],
        ["verify", str(tmp_path), "-j", value],
        ["fixture", "flash-random", str(tmp_path / "out"), "--jobs", value],
    ):
        assert "'--jobs'" in _refused(capsys, monkeypatch, *args), args
    assert not (tmp_path / "out").exists()


def test_devices_are_one_choice_where_a_command_runs_on_a_device():
    for path in (("load",), ("generate",), ("serve",)):
        assert "--device [auto|cuda|cpu]" in _help(*path)
        assert "default: auto" in _help(*path)


def test_the_store_root_is_spelled_store_everywhere(tiny_pack, tmp_path):
    for path in (("prepare",), ("cache",), ("cache", "ls"), ("cache", "rm"), ("cache", "prune")):
        text = _help(*path)
        assert "--store DIR" in text, path
        assert "--root" not in text and "--output" not in text and "-o," not in text, path
    runner = CliRunner()
    store = tmp_path / "store"
    built = runner.invoke(cli, ["prepare", str(tiny_pack), "--store", str(store), "--json"])
    assert built.exit_code == 0, built.output
    key = Path(json.loads(built.output)["path"]).name
    for args in (
        ["cache", "ls", "--store", str(store), "--json"],
        ["cache", "--store", str(store), "ls", "--json"],
        ["cache", "--root", str(store), "ls", "--json"],  # old spellings still parse
        ["cache", "ls", "--root", str(store), "--json"],
    ):
        listed = runner.invoke(cli, args)
        assert listed.exit_code == 0, listed.output
        assert [i["key"] for i in json.loads(listed.output)["images"]] == [key], args
    again = runner.invoke(cli, ["prepare", str(tiny_pack), "-o", str(store), "--json"])
    assert again.exit_code == 0 and json.loads(again.output)["path"] == str(store / key)


@pytest.mark.parametrize("value", ["-1", str(2**63), str(2**70)])
def test_seeds_outside_0_to_2_63_are_refused(capsys, monkeypatch, tmp_path, value):
    assert "'--seed'" in _refused(
        capsys, monkeypatch, "generate", str(tmp_path), "--prompt", "hi", "--seed", value
    )
    assert "'--seed'" in _refused(
        capsys, monkeypatch, "fixture", "tiny", str(tmp_path / "t"), "--seed", value
    )
    assert not (tmp_path / "t").exists()


def test_seed_zero_is_a_seed(tmp_path):
    result = CliRunner().invoke(cli, ["fixture", "tiny", str(tmp_path / "t"), "--seed", "0"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("value", ["0", "-1", "3", "1000", str(2**70)])
@pytest.mark.parametrize("command", ["plan", "prepare"])
def test_tp_worlds_tfc_cannot_build_are_refused(capsys, monkeypatch, tiny_pack, tmp_path, command, value):
    extra = ["--store", str(tmp_path)] if command == "prepare" else []
    line = _refused(capsys, monkeypatch, command, str(tiny_pack), "--tp", value, *extra)
    assert "'--tp'" in line and "1, 2, 4 or 8" in line
    assert list(tmp_path.iterdir()) == []


def _vocab(pack: Path) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(pack / "tokenizer.json")).get_vocab_size(with_added_tokens=True)


@pytest.mark.parametrize("ids", [str(2**70), "-1", "vocab", "1,2,99999"])
def test_engram_ids_outside_the_vocabulary_are_refused(capsys, monkeypatch, tiny_pack, ids):
    n = _vocab(tiny_pack)
    ids = ids.replace("vocab", str(n))
    line = _refused(capsys, monkeypatch, "engram", str(tiny_pack), "--ids", ids)
    assert "'--ids'" in line and f"0..{n - 1}" in line
    line = _refused(capsys, monkeypatch, "engram", str(tiny_pack), "--ids", "1", "--lookback", ids)
    assert "'--lookback'" in line


def test_engram_ids_inside_the_vocabulary_still_hash(tiny_pack):
    last = _vocab(tiny_pack) - 1
    result = CliRunner().invoke(cli, ["engram", str(tiny_pack), "--ids", f"0,1,{last}", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["ids"] == [0, 1, last]


def test_prune_sizes_past_any_store_are_refused(capsys, monkeypatch, tmp_path):
    line = _refused(capsys, monkeypatch, "cache", "prune", "--store", str(tmp_path), "--max-bytes", "9" * 400)
    assert "'--max-bytes'" in line


@pytest.mark.parametrize("path", ALL, ids=" ".join)
def test_every_help_ends_with_an_example(path):
    assert _help(*path).rstrip().splitlines()[-1].strip().startswith(f"Example: tfc {path[0]}")


def test_the_top_help_ends_with_an_example():
    assert _help().rstrip().splitlines()[-1].strip().startswith("Example: tfc ")


def test_no_command_offers_a_second_way_to_run_the_stages():
    # the small-op stages run one way a device (their Triton kernels on a GPU): no flag picks torch.compile
    ctx = click.Context(cli)
    for command in ("serve", "generate", "load"):
        opts = {o for p in cli.get_command(ctx, command).params for o in p.opts + p.secondary_opts}
        assert not opts & {"--no-compile", "--stage-kernels", "--no-stage-kernels"}, command


@pytest.mark.parametrize(
    ("name", "value", "args"),
    [("TFC_GRAPHS_MAX", "many", ("load",)), ("TFC_GRAPHS", "maybe", ("generate", "--prompt", "hi")),
     ("TFC_TP_HANG_S", "0.01", ("serve",)), ("TFC_SSE_KEEPALIVE_S", "-1", ("serve",)),
     ("TFC_TP_TIMEOUT_S", "soon", ("chat",))],
)  # fmt: skip
def test_a_bad_setting_is_one_line_naming_it_before_any_work(
    capsys, monkeypatch, tmp_path, name, value, args
):
    monkeypatch.setenv(name, value)
    line = _refused(capsys, monkeypatch, args[0], str(tmp_path), *args[1:], "--device", "cpu")
    assert line.startswith(f"tfc: error: {name}={value!r} cannot be used: {name} takes "), line


def test_the_graphs_flag_reaches_the_boot_as_an_option_not_a_variable(monkeypatch, tmp_path):
    """--no-graphs goes down as RuntimeOptions(graphs=False); the environment the ranks inherit stays as it was."""
    import os

    from tfc.runtime.worker import worker

    seen = {}

    def start(image, **kw):
        seen.update(kw, environ=dict(os.environ))
        raise SystemExit(0)

    monkeypatch.setattr(worker.Worker, "start", start)
    monkeypatch.setenv("TFC_GRAPHS_MAX", "5")
    before = dict(os.environ)
    assert CliRunner().invoke(cli, ["load", str(tmp_path), "--device", "cpu", "--no-graphs"]).exit_code == 0
    options = seen["options"]
    assert (options.graphs, options.max_graphs) == (False, 5) and seen["environ"] == before
