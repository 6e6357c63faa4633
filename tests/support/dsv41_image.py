"""A synthetic pack prepared into a TP=1 image through `tfc prepare` (Engram tables included), for runtime tests."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from tfc.cli import cli


def prepared_image(pack: Path, store: Path) -> Path:
    """The image folder `tfc prepare PACK -o STORE --engram-dir PACK` writes."""
    result = CliRunner().invoke(cli, ["prepare", str(pack), "-o", str(store), "--engram-dir", str(pack)])
    assert result.exit_code == 0, result.output
    return next(p for p in Path(store).iterdir() if p.is_dir() and not p.name.startswith("."))
