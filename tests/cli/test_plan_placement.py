"""`tfc plan` / `tfc prepare` with a target's memory: tiers per rank in --json and words, one-line refusals, and
the placement recorded in each manifest (segment tiers, the plan's inputs) and keyed."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner
from tfc.cache.format import RankManifest
from tfc.cache.verify import verify_image
from tfc.compiler.dsv41_family import PLANNER
from tfc.compiler.placement import GIB
from tfc.compiler.world_plan import plan_world
from tfc.packs.pack import open_pack

from tfc.cli import cli, main

TARGET = ["--max-context", "64", "--max-seqs", "1", "--overhead-gib", "0"]


@pytest.fixture(scope="module")
def sizes(tiny_pack):
    """(total bytes, Engram row bytes, KV bytes of one 64-token sequence) of the tiny pack at TP=1."""
    pack = open_pack(tiny_pack)
    plan = plan_world(pack, 1).plans[0]
    rows = sum(s.nbytes for s in plan.segments if s.kind == "engram_rows")
    return plan.total, rows, PLANNER.placement.kv_bytes(pack.config, 1, 64)


def _gib(nbytes: int) -> str:
    return repr(nbytes / GIB)


def _rows_off(sizes) -> list[str]:
    """A GPU that holds everything but the Engram rows."""
    total, rows, kv = sizes
    return ["--gpu-memory-gib", _gib(total - rows + kv + 4096), *TARGET]


def test_plan_json_reports_bytes_by_tier_per_rank(tiny_pack, sizes):
    total, rows, _ = sizes
    result = CliRunner().invoke(cli, ["plan", str(tiny_pack), "--json", *_rows_off(sizes)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    (rank,) = data["ranks"]
    assert rank["tiers"] == {"device": total - rows, "host": rows, "nvme": 0}
    placement = data["placement"]
    assert placement["inputs"]["max_context"] == 64 and placement["inputs"]["host_memory_gib"] is None
    assert placement["off_device"] == {"layers.1.engram.rows": "host", "layers.2.engram.rows": "host"}
    assert rank["device_need"] == total - rows + placement["kv_bytes"]
    plain = json.loads(CliRunner().invoke(cli, ["plan", str(tiny_pack), "--json"]).output)
    assert plain["placement"] is None and plain["ranks"][0]["tiers"] == {
        "device": total,
        "host": 0,
        "nvme": 0,
    }


def test_plan_prints_the_tiers_and_the_kv_room(tiny_pack, sizes):
    result = CliRunner().invoke(cli, ["plan", str(tiny_pack), *_rows_off(sizes)])
    assert result.exit_code == 0, result.output
    assert "Engram rows: layers.1.engram.rows in host, layers.2.engram.rows in host" in result.output
    assert "rank 0: device " in result.output and "GPU memory left for KV" in result.output
    result = CliRunner().invoke(cli, ["plan", str(tiny_pack), "--tp", "2", "--gpu-memory-gib", "7"])
    assert result.exit_code == 0 and "rank 1: device" in result.output and "Engram rows" not in result.output


def _refused(capsys, monkeypatch, *args: str) -> str:
    monkeypatch.setattr(sys, "argv", ["tfc", *args])
    with pytest.raises(SystemExit) as done:
        main()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert done.value.code == 2 and len(lines) == 1 and lines[0].startswith("tfc: error: "), lines
    return lines[0]


def test_a_target_too_small_is_one_line_and_exit_2(capsys, monkeypatch, tiny_pack, sizes):
    line = _refused(
        capsys, monkeypatch, "plan", str(tiny_pack), "--gpu-memory-gib", _gib(sizes[0] // 8), *TARGET
    )
    assert "GPU memory" in line and "--tp 2" in line
    line = _refused(
        capsys, monkeypatch, "plan", str(tiny_pack), *_rows_off(sizes), "--host-memory-gib", "1e-9"
    )
    assert "--nvme DIR" in line and "--host-memory-gib" in line
    line = _refused(capsys, monkeypatch, "prepare", str(tiny_pack), "--nvme", "/x")
    assert "--nvme places segments for a target: give its --gpu-memory-gib too" in line
    line = _refused(capsys, monkeypatch, "plan", str(tiny_pack), "--gpu-memory-gib", "0")
    assert "--gpu-memory-gib" in line


def test_prepare_records_the_placement_and_keys_on_it(tmp_path, tiny_pack, sizes):
    total, rows, _ = sizes
    store = tmp_path / "store"
    args = ["prepare", str(tiny_pack), "-o", str(store), "--json"]
    placed = json.loads(CliRunner().invoke(cli, [*args, *_rows_off(sizes)]).output)
    plain = json.loads(CliRunner().invoke(cli, args).output)
    assert placed["world_key"] != plain["world_key"]  # another target is another image
    assert placed["tiers"] == [{"device": total - rows, "host": rows, "nvme": 0}]
    m = RankManifest.load(f"{placed['path']}/rank0")
    assert {s.name for s in m.segments if s.tier != "device"} == {
        "layers.1.engram.rows",
        "layers.2.engram.rows",
    }
    assert m.plan["placement"]["inputs"] == m.key_inputs["placement"]
    assert m.plan["placement"]["ranks"] == placed["tiers"]
    assert RankManifest.from_bytes(m.to_json().encode()) == m
    assert verify_image(f"{placed['path']}/rank0").ok
    plain_m = RankManifest.load(f"{plain['path']}/rank0")
    assert "placement" not in plain_m.plan and {s.tier for s in plain_m.segments} == {"device"}
    assert [s.digest for s in plain_m.segments] == [s.digest for s in m.segments]  # tiers do not change bytes
    shown = json.loads(CliRunner().invoke(cli, ["inspect", placed["path"], "--json"]).output)["ranks"][0]
    assert shown["bytes_by_tier"] == placed["tiers"][0] and shown["placed_for"]["max_seqs"] == 1
    assert "  placed   device " in CliRunner().invoke(cli, ["inspect", placed["path"]]).output
    again = json.loads(CliRunner().invoke(cli, [*args, *_rows_off(sizes)]).output)
    assert again["ranks"] == {"0": "hit"} and again["tiers"] is None
