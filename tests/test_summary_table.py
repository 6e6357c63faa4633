"""benchmarks/summary.json keeps its schema and the headline ids, and the README's figures table is its rendering."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
KEYS = {"id", "value", "unit", "target", "limit", "hardware", "date", "commit", "command"}
# the ids the issues name: each stays listed, with its target, measured or not
NAMED = ("decode.floor_ratio.rows1", "decode.floor_ratio.rows16", "decode.floor_ratio.rows64",
         "decode.floor_ratio.rows256", "decode.launches_per_layer", "drafter.round_vs_step",
         "decode.whole_flash_tok_s.streams1", "decode.whole_flash_tok_s.drafted_al2.8",
         "serve.whole_flash_tok_s.streams64", "prefill.peak_ratio.2k", "prefill.peak_ratio.16k",
         "engram.host_step_share", "engram.nvme_step_share", "decode.whole_flash_tok_s.one_gpu_streams1",
         "boot.warm_upload_vs_floor", "verify.full_vs_read.cold", "prepare.vs_copy", "cli.inspect_s",
         "parallel.tp2_boot_ratio", "prefix_cache.host_restore_vs_h2d")  # fmt: skip


@pytest.fixture(scope="module")
def summary_module():
    spec = importlib.util.spec_from_file_location("bench_summary", ROOT / "benchmarks" / "_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def metrics() -> list[dict]:
    return json.loads((ROOT / "benchmarks" / "summary.json").read_text(encoding="utf-8"))["metrics"]


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def test_every_entry_has_the_schema(metrics):
    ids = [m["id"] for m in metrics]
    assert len(ids) == len(set(ids)), "an id listed twice"
    for m in metrics:
        assert set(m) == KEYS, m["id"]
        assert m["unit"] in ("fraction", "x", "s", "tok/s", "launches"), m["id"]
        assert m["target"] is None or (m["target"]["op"] in (">=", "<=") and _number(m["target"]["value"])), (
            m["id"]
        )
        if m["value"] is None:  # never measured: listed with its target, nothing else claimed
            assert m["hardware"] is m["date"] is m["commit"] is m["command"] is None, m["id"]
            continue
        assert _number(m["value"]) and m["value"] >= 0, m["id"]
        assert all(isinstance(m[k], str) and m[k] for k in ("hardware", "date", "commit", "command")), m["id"]
        if m["unit"] == "fraction":  # ratios as fractions, never percent
            assert m["value"] < 5, m["id"]


def test_the_named_ids_are_listed(metrics):
    ids = {m["id"] for m in metrics}
    assert not [i for i in NAMED if i not in ids]


def test_readme_table_is_the_rendering(summary_module, metrics):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    rendered = summary_module.render_table({"metrics": metrics})
    assert summary_module.readme_block(readme) == rendered, "run: python benchmarks/_summary.py --readme"
    rows = rendered.splitlines()[2:]
    assert len(rows) <= 12
    cells = [c.strip() for row in rows for c in row.strip("|").split(" | ")]
    assert max(len(c) for c in cells) <= 200


def test_a_run_replaces_its_entry_and_keeps_the_others(summary_module, metrics, tmp_path):
    path = tmp_path / "summary.json"
    summary_module.write_summary({"metrics": metrics}, path)
    target = summary_module.parse_target(">= 0.5")
    summary_module.update_summary("decode.floor_ratio.rows1", 0.61, "fraction", target, "the floor", "H200 (x)",
                                  "2027-01-01", "abc1234", "python benchmarks/decode.py --json", path)  # fmt: skip
    summary_module.update_summary("decode.new_metric", 2.0, "x", None, None, "H200 (x)", "2027-01-01", "abc1234",
                                  "python benchmarks/decode.py --json", path)  # fmt: skip
    after = json.loads(path.read_text(encoding="utf-8"))["metrics"]
    assert [m["id"] for m in after] == [m["id"] for m in metrics] + ["decode.new_metric"]
    changed = {m["id"]: m for m in after}["decode.floor_ratio.rows1"]
    assert changed["value"] == 0.61 and changed["commit"] == "abc1234" and changed["target"] == target
    assert [m for m in after if m["id"] not in ("decode.floor_ratio.rows1", "decode.new_metric")] == [
        m for m in metrics if m["id"] != "decode.floor_ratio.rows1"
    ]


@pytest.mark.parametrize("text", ["0.5", ">= x", "== 1", ""])
def test_a_target_is_written_as_a_bound(summary_module, text):
    with pytest.raises(ValueError, match="a target reads"):
        summary_module.parse_target(text)
