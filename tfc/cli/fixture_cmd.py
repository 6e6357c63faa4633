"""`tfc fixture tiny|flash-headers OUT`: write a synthetic pack in the real DeepSeek-V4.1 layout."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def fixture() -> None:
    """Write a synthetic pack in the real layout."""


@fixture.command("tiny")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", default=0, show_default=True, help="Seed of every random payload.")
def tiny(out: Path, seed: int) -> None:
    """The tiny pack (a few tens of MB): every layer mode, Engram, DSpark, all codebooks."""
    from tfc.fixtures.tiny import write_tiny

    click.echo(write_tiny(out, seed))


@fixture.command("flash-headers")
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
def flash_headers(out: Path) -> None:
    """DeepSeek-V4.1-Flash at full geometry: real headers, payloads as holes (sparse files, ~200 GB apparent)."""
    from tfc.fixtures.flash_headers import write_flash_headers

    click.echo(write_flash_headers(out))
