"""benchmarks/gpu_all.sh's front door on the CPU (its parts need a GPU): --help, and a mistyped part or option is one
line and exit 2 before anything is made."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_all.sh"


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "WORK": str(tmp_path / "work")}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30, env=env)


def test_help_names_every_part_and_the_wheels(tmp_path):
    got = _run("--help", tmp_path=tmp_path)
    assert got.returncode == 0 and "PART: tests decode prefill" in got.stdout and "--wheels" in got.stdout
    assert not (tmp_path / "work").exists()


def test_a_mistyped_part_or_option_is_refused_in_one_line(tmp_path):
    for args, said in (
        (("abc1234", "decode", "decod"), "unknown part 'decod'"),
        (("--bogus",), "unknown option"),
    ):
        got = _run(*args, tmp_path=tmp_path)
        assert got.returncode == 2 and said in got.stderr and len(got.stderr.strip().splitlines()) == 1, got
    assert not (tmp_path / "work").exists()  # refused before the work folder or the slice
