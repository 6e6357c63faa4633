"""`tfc fixture tiny|flash-headers|flash-random OUT`: write a synthetic pack in the real DeepSeek-V4.1 layout."""

from __future__ import annotations

from pathlib import Path

import click

from tfc.cli.options import example, jobs_option, seed_option


@click.group(epilog=example("tfc fixture tiny ./tiny-pack"))
def fixture() -> None:
    """Write a synthetic pack in the real layout."""


@fixture.command("tiny", epilog=example("tfc fixture tiny ./tiny-pack --seed 1"))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@seed_option("Seed of every random payload, 0 to 2**63-1.", default=0)
def tiny(out: Path, seed: int) -> None:
    """The tiny pack (a few tens of MB): every layer mode, Engram, DSpark, all codebooks."""
    from tfc.fixtures.tiny import write_tiny

    click.echo(write_tiny(out, seed))


@fixture.command("flash-headers", epilog=example("tfc fixture flash-headers ./flash-headers"))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
def flash_headers(out: Path) -> None:
    """DeepSeek-V4.1-Flash at full geometry: real headers, payloads as holes (sparse files, ~200 GB apparent)."""
    from tfc.fixtures.flash_headers import write_flash_headers

    click.echo(write_flash_headers(out))


@fixture.command(
    "flash-random",
    epilog=example(
        "tfc fixture flash-random ./flash-random --layers 4 -j 8",
        "tfc fixture flash-random ./flash-engram --layers 4 --engram real",
    ),
)
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--layers", default=4, show_default=True, help="Backbone layers (at least 4; 4 makes about 22 GB)."
)
@click.option(
    "--engram",
    type=click.Choice(["none", "real"]),
    default="none",
    show_default=True,
    help="real: two Engram layers with the real model's table rows (~100 GB each, sparse files: no disk) and a "
    "tokenizer.json, so placement and the Engram tiers run at the real table size.",
)
@seed_option("Seed of every random payload, 0 to 2**63-1.", default=0)
@jobs_option("Writer threads.", default=8)
def flash_random(out: Path, layers: int, engram: str, seed: int, jobs: int) -> None:
    """Flash geometry with fewer layers and random payloads written out: packs of tens of GB for benchmarks."""
    from tfc.fixtures.flash_random import write_flash_random

    if layers < 4:
        raise click.BadParameter(
            "needs at least 4 layers (swa, swa, ratio 2, ratio 1)", param_hint="--layers"
        )
    click.echo(write_flash_random(out, layers=layers, seed=seed, jobs=jobs, engram=engram))
