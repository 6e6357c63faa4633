"""benchmarks/decode.py --host-experts on the CPU (the run itself needs a GPU): the GPU budget it prepares the pack
for moves exactly one layer's routed experts to host memory, and a decode result that cannot stand as the all-HBM
run is refused in words."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def decode_script():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_decode", ROOT / "benchmarks" / "decode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_budget_moves_exactly_one_layers_experts(decode_script, tiny_pack, tmp_path):
    from click.testing import CliRunner

    from tfc.cli import cli

    gib = decode_script.one_cold_layer_gib(tiny_pack, 256, 16)
    got = CliRunner().invoke(cli, ["prepare", str(tiny_pack), "--store", str(tmp_path), "--gpu-memory-gib",
                                   f"{gib:.3f}", "--max-context", "256", "--max-seqs", "16"])  # fmt: skip
    assert got.exit_code == 0, got.output
    image = Path(got.output.strip().splitlines()[-1])
    assert len(decode_script.cold_layers_of(image / "rank0" if (image / "rank0").is_dir() else image)) == 1
    # a GiB more (the tiny pack's layers hold about a MB of experts each) keeps every layer's on the device
    roomy = CliRunner().invoke(cli, ["plan", str(tiny_pack), "--gpu-memory-gib", f"{gib + 1:.3f}",
                                     "--max-context", "256", "--max-seqs", "16", "--json"])  # fmt: skip
    assert roomy.exit_code == 0, roomy.output
    assert json.loads(roomy.output)["placement"]["cold_layers"] == []


def test_an_unfit_all_hbm_result_is_refused_in_words(decode_script, tmp_path):
    bad, old, good = (tmp_path / f"{n}.json" for n in ("bad", "old", "good"))
    bad.write_text("not json")
    old.write_text(json.dumps({"data": {"decode": {"1": {"step_s": 1.0}, "16": {"step_s": 2.0}}}}))
    good.write_text(json.dumps({"data": {"decode": {r: {"logits_sha256": "ab"} for r in ("1", "16")}}}))
    assert "not a decode.py --json result" in decode_script.all_hbm_problem(bad)
    assert "logits digests" in decode_script.all_hbm_problem(old)
    assert decode_script.all_hbm_problem(good) is None
