"""`tfc load IMAGE`: open, upload and capture one rank, print each phase's time, exit."""

from __future__ import annotations

import json
import sys

import click


def _progress(enabled: bool):
    """A rich byte progress bar on stderr; returns (callback, stop)."""
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    bar = Progress(
        TextColumn("[bold]upload"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not enabled,
    )
    task = [None]

    def update(done: int, total: int) -> None:
        if task[0] is None:
            bar.start()
            task[0] = bar.add_task("", total=total)
        bar.update(task[0], completed=done)

    return update, bar.stop


@click.command("load")
@click.argument("image", type=click.Path(exists=True, file_okay=False))
@click.option("--rank", type=int, help="Rank to load (default: the folder's rank, or 0).")
@click.option("--device", type=click.Choice(["auto", "cuda", "cpu"]), default="auto", show_default=True)
@click.option(
    "--method",
    type=click.Choice(["auto", "mmap", "ring", "register"]),
    default="auto",
    show_default=True,
    help="Upload path on CUDA: auto takes mmap when the page cache holds the image, else ring (a CPU arena takes host copies).",
)
@click.option("--verify", is_flag=True, help="Recompute every payload digest (parallel) before uploading.")
@click.option("--no-graphs", is_flag=True, help="Turn CUDA graphs off (same as TFC_GRAPHS=0).")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    help="Copy / reader / registration threads (default: mmap 12 C or 16 Python threads, at most the CPUs; ring and register 8).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the phase timings as JSON.")
def load(image, rank, device, method, verify, no_graphs, threads, as_json) -> None:
    """Open IMAGE (a rank or image folder), upload it to the device, capture graphs, print phase times."""
    from tfc.runtime.boot import boot
    from tfc.runtime.phases import phases_path, write_phases

    update, stop = _progress(sys.stderr.isatty() and not as_json)
    try:
        booted = boot(
            image,
            rank=rank,
            device=device,
            method=method,
            verify="full" if verify else None,
            graphs=False if no_graphs else None,
            threads=threads,
            progress=update,
        )
    finally:
        stop()
    try:
        m = booted.image.manifest
        extra = {
            "image": str(booted.image.path),
            "rank": m.rank,
            "world": m.world,
            "device": str(booted.arena.device),
            "method": booted.upload.method,
            "upload_config": booted.upload.config,
            "upload_steps": booted.upload.steps,
            "segments": len(m.segments),
            "bytes": booted.arena.nbytes,
            "chunks": len(booted.arena.chunks),
            "checks": list(booted.image.checks),
            "graphs": booted.graphs.settings.enabled,
        }
        out = phases_path()
        if out is not None:
            write_phases(booted.phases, out, **extra)
        if as_json:
            json.dump(booted.phases.to_dict(**extra), sys.stdout)
            sys.stdout.write("\n")
            return
        click.echo(
            f"rank {m.rank} of {m.world}: {len(m.segments)} segments, {booted.arena.nbytes:,} bytes "
            f"in {len(booted.arena.chunks)} chunk(s) on {booted.arena.device}; checked {', '.join(booted.image.checks)}"
        )
        for p in booted.phases.phases:
            rate = f"  {p.gbps:7.2f} GB/s" if p.gbps else " " * 14
            click.echo(f"  {p.name:<8} {p.seconds * 1e3:10.1f} ms{rate}  {p.note}")
        click.echo(f"  {'total':<8} {booted.phases.to_dict()['wall_ms']:10.1f} ms")
        if out is not None:
            click.echo(f"phase timings written to {out}", err=True)
    finally:
        booted.close()
