"""The tiny pack prepared at several TP worlds (one store each), for tests that compare TP=N with TP=1."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tfc.cli import cli


def prepare_worlds(pack: Path, root: Path, worlds: tuple[int, ...] = (1, 2, 4)) -> dict[int, str]:
    """{world: image folder} of the pack prepared with --tp world (every world from the same options)."""
    out = {}
    for world in worlds:
        result = CliRunner().invoke(
            cli, ["prepare", str(pack), "--tp", str(world), "-o", str(root / f"tp{world}")]
        )
        assert result.exit_code == 0, result.output
        out[world] = result.output.strip().splitlines()[-1]
    return out
