"""`tfc inspect` as a user runs it: text and --json on both fixtures, one line and exit 2 on damage."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from tfc.packs.safetensors_header import read_header


def tfc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tfc", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def tiny_json(tiny_pack):
    run = tfc("inspect", str(tiny_pack), "--json")
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_text_lists_blocks_modes_kinds_and_widths(tiny_pack):
    run = tfc("inspect", str(tiny_pack))
    assert run.returncode == 0 and run.stderr == ""
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"pack     {tiny_pack}")
    blocks = {line.split()[0]: line.split()[1] for line in lines if line.startswith(("layers.", "mtp."))}
    assert blocks == {**{f"layers.{i}": m for i, m in enumerate(["swa", "swa", "full", "reuse", "full", "reuse", "reindex", "reuse"])},
                      "mtp.0": "swa", "mtp.1": "swa", "mtp.2": "swa"}  # fmt: skip
    text = run.stdout
    for needle in (
        "tensors by kind",
        "exl3.trellis",
        "bytes by part",
        "routed_experts",
        "ffn.experts.w1",
        "2.5:",
        "codebooks",
    ):
        assert needle in text


def test_json_counts_agree_with_the_headers(tiny_pack, tiny_json):
    s = tiny_json
    headers = [read_header(p) for p in tiny_pack.glob("*.safetensors")]
    assert s["tensors"] == sum(len(h.names) for h in headers) == sum(s["tensors_by_kind"].values())
    assert s["bytes"]["total"] == sum(sum(h.nbytes) for h in headers) == sum(s["bytes"]["by_kind"].values())
    assert sum(s["bytes"]["by_part"].values()) == s["bytes"]["total"]
    assert s["shards"] == 7 and s["groups"] == 361 and s["ignored"] == 2
    assert s["config"]["kv_source_layer_ids"] == [2, 4] and s["codebooks"].keys() == {"3inst", "mcg", "mul1"}
    assert s["widths"]["ffn.experts.w1"] == {"2": 48, "2.5": 4, "3": 8, "4": 4}
    b6 = s["blocks"][6]
    assert (b6["block"], b6["mode"], b6["kv_source"], b6["index_source"], b6["uses_candidates"]) == (
        "layers.6",
        "reindex",
        4,
        6,
        True,
    )
    assert s["blocks"][2]["expert_bits"]["w1"] == {"2": 3, "2.5": 2, "3": 2, "4": 1}


def test_flash_headers_json(flash_headers_pack):
    run = tfc("inspect", str(flash_headers_pack), "--json")
    assert run.returncode == 0, run.stderr
    s = json.loads(run.stdout)
    assert s["shards"] == 46 and 185_000 <= s["tensors"] <= 195_000 and s["groups"] == 47_900
    # ~201 GB of EXL3 pack plus DeepSeek's two ~101 GB Engram tables beside it
    assert 395e9 < s["bytes"]["total"] < 420e9
    assert s["bytes"]["by_part"]["routed_experts"] > 0.9 * (s["bytes"]["total"] - 202_758_032_928)
    assert [b["mode"] for b in s["blocks"]].count("reindex") == 4 and len(s["blocks"]) == 43
    assert s["widths"]["dspark.ffn.experts.w2"] == {"4": 384}


def test_damaged_pack_is_one_line_and_exit_2(tiny_pack, tmp_path):
    pack = tmp_path / "pack"
    shutil.copytree(tiny_pack, pack, copy_function=os.link)
    victim = pack / "model-00004-of-00005.safetensors"
    data = bytearray(victim.read_bytes())
    victim.unlink()
    data[20:30] = b"!!!!!!!!!!"  # inside the JSON header
    victim.write_bytes(bytes(data))
    run = tfc("inspect", str(pack))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and run.stderr.startswith(
        "tfc: error: model-00004-of-00005.safetensors"
    )
    assert "Traceback" not in run.stderr
    missing = tfc("inspect", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_inspect_imports_neither_torch_nor_numpy(tiny_pack):
    code = (
        "import sys; from tfc.cli import cli; "
        f"cli.main(['inspect', {str(tiny_pack)!r}, '--json'], standalone_mode=False); "
        "bad = [m for m in ('torch', 'triton', 'numpy') if m in sys.modules]; "
        "sys.exit(f'imported {bad}' if bad else 0)"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
