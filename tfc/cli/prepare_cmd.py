"""`tfc prepare PACK`: build (or find in the cache) the prepared image of every rank."""

from __future__ import annotations

import json
import sys

import click

from tfc.cli.options import example, jobs_option, placement_options, store_option, tp_option


def _parse_ranks(text: str | None) -> list[int] | None:
    if not text:
        return None
    from tfc.compiler.errors import PlanError

    try:
        return [int(r) for r in text.replace(" ", "").split(",") if r]
    except ValueError:
        raise PlanError(f"--ranks must be comma-separated integers, got {text!r}") from None


def _progress_factory(enabled: bool):
    """A rich progress bar per rank with bytes/s; returns (factory, stop)."""
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    bars = Progress(
        TextColumn("[bold]rank {task.fields[rank]}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=False,
        disable=not enabled,
    )

    def factory(totals: dict[int, int]):
        bars.start()
        tasks = {rank: bars.add_task("", total=total, rank=rank) for rank, total in totals.items()}
        return lambda rank, nbytes: bars.advance(tasks[rank], nbytes)

    return factory, bars.stop


@click.command(
    "prepare",
    epilog=example(
        "tfc prepare ./pack --tp 2 --store /data/tfc-images",
        "tfc prepare ./pack --tp 2 --gpu-memory-gib 141 --host-memory-gib 240 --max-context 4096",
    ),
)
@click.argument("pack_path", metavar="PACK", type=click.Path(exists=True, file_okay=False))
@store_option(old=("-o", "--output"))
@tp_option()
@placement_options()
@click.option("--ranks", help="Build only these ranks, e.g. 0,1 (default: every rank).")
@jobs_option("Parallel reads (default: twice the cores, 4..16).")
@click.option(
    "--strict-identity", is_flag=True, help="Key on every payload byte of the pack, not sampled blocks."
)
@click.option(
    "--engram-dir",
    type=click.Path(exists=True, file_okay=False),
    help="Folder holding DeepSeek's Engram table files.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Remove this key's image from the store and build it again (refused while a process holds it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def prepare(
    pack_path, store, world, budget, ranks, jobs, strict_identity, engram_dir, force, as_json
) -> None:
    """Plan and build every rank's image of PACK, or find it in the store; print where it is. With
    --gpu-memory-gib the image is placed for that target (`tfc plan` shows how), and is another image."""
    from tfc.cache.store import default_root
    from tfc.compiler.prepare import prepare as run_prepare
    from tfc.packs.pack import open_pack

    pack = open_pack(pack_path)
    factory, stop = _progress_factory(sys.stderr.isatty() and not as_json)
    try:
        result = run_prepare(
            pack,
            store or default_root(),
            world,
            ranks=_parse_ranks(ranks),
            jobs=jobs,
            strict_identity=strict_identity,
            force=force,
            engram_dir=engram_dir,
            progress_factory=factory,
            budget=budget,
        )
    finally:
        stop()
    if as_json:
        json.dump(
            {
                "path": str(result.path),
                "world_key": result.world_key,
                "world": result.world,
                "ranks": {str(r): s for r, s in result.ranks.items()},
                "bytes_written": result.bytes_written,
                "seconds": round(result.seconds, 3),
                "tiers": None if result.placement is None else list(result.placement.ranks),
            },
            sys.stdout,
        )
        sys.stdout.write("\n")
        return
    built = [r for r, s in result.ranks.items() if s == "built"]
    hits = [r for r, s in result.ranks.items() if s == "hit"]
    if built:
        rate = result.bytes_written / max(result.seconds, 1e-9) / 1e9
        click.echo(
            f"built rank(s) {','.join(map(str, built))}: {result.bytes_written:,} bytes in {result.seconds:.2f} s ({rate:.2f} GB/s)",
            err=True,
        )
    if hits:
        click.echo(f"cache hit for rank(s) {','.join(map(str, hits))}", err=True)
    if result.placement is not None and result.placement.budget is not None:
        gib = 1 << 30
        for rank in built:
            tiers = result.placement.ranks[rank]
            click.echo(
                f"rank {rank} placed: device {tiers['device'] / gib:.1f} GiB, host {tiers['host'] / gib:.1f} GiB, "
                f"nvme {tiers['nvme'] / gib:.1f} GiB",
                err=True,
            )
    click.echo(str(result.path))
