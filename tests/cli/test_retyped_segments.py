"""A manifest that retypes, reshapes or renames a segment (re-signed, its digests agreeing): `tfc verify` and
`tfc load` refuse it in one line naming the segment, what its family expects and what it found."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from tfc.cache.format import root_digest_of

from tfc.cli import main


def _tfc(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `tfc ARGS` through the command's own entry point."""
    monkeypatch.setattr(sys, "argv", ["tfc", *args])
    code = 0
    try:
        main()
    except SystemExit as done:
        code = done.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def _forge(world: Path, name: str, record: dict) -> None:
    """Rewrite one segment record of rank 0's manifest and sign the manifest again (its root digest)."""
    path = world / "rank0" / "manifest.json"
    obj = json.loads(path.read_text())
    (seg,) = [s for s in obj["segments"] if s["name"] == name]
    seg.update(record)
    obj["root_digest"] = root_digest_of({k: v for k, v in obj.items() if k != "root_digest"})
    path.write_text(json.dumps(obj))


@pytest.fixture
def world(tiny_image, tmp_path) -> Path:
    src = Path(tiny_image)
    dst = tmp_path / "store" / src.name
    shutil.copytree(src, dst)
    return dst


FORGERIES = {  # the tiny model: hidden size 256, mHC mixes of 24 x 1024
    "float32 as uint8": ("layers.0.attn_norm.weight", {"dtype": "uint8", "shape": [1024]},
                         "segment layers.0.attn_norm.weight: expected float32[256], found uint8[1024]"),
    "transposed": ("layers.1.hc_attn_fn", {"shape": [1024, 24]},
                   "segment layers.1.hc_attn_fn: expected float32[24, 1024], found float32[1024, 24]"),
    "bf16 as fp16": ("embed.weight", {"dtype": "float16"}, "segment embed.weight: expected bfloat16[640, 256]"),
    "renamed": ("norm.weight", {"name": "norm.weights"}, "segment norm.weights is not one a deepseek_v41 image"),
}  # fmt: skip


@pytest.mark.parametrize("forgery", list(FORGERIES))
def test_verify_and_load_refuse_a_forged_segment_record_in_one_line(world, forgery, monkeypatch, capsys):
    name, record, words = FORGERIES[forgery]
    _forge(world, name, record)
    code, out, _ = _tfc(monkeypatch, capsys, "verify", str(world))
    problems = [line for line in out.splitlines() if not line.startswith(("ok:", "FAILED"))]
    assert code == 1 and len(problems) == 1 and words in problems[0], out
    code, _, err = _tfc(monkeypatch, capsys, "load", str(world), "--device", "cpu")
    assert code == 2 and err.startswith("tfc: error:") and err.count("\n") == 1 and words in err, err


def test_the_untouched_image_verifies_and_loads(world, monkeypatch, capsys):
    assert _tfc(monkeypatch, capsys, "verify", str(world))[0] == 0
    assert _tfc(monkeypatch, capsys, "load", str(world), "--device", "cpu")[0] == 0
