"""`tfc load IMAGE`: open, upload and capture one rank, print each phase's time, exit."""

from __future__ import annotations

import json
import sys

import click

from tfc.cli.options import device_option, example, jobs_option
from tfc.cli.progress import byte_bar


@click.command("load", epilog=example("tfc load ~/.cache/tfc/images/263e81d431bff5c3 --json"))
@click.argument("image", type=click.Path(exists=True, file_okay=False))
@click.option("--rank", type=int, help="Rank to load (default: the folder's rank, or 0).")
@device_option()
@click.option(
    "--method",
    type=click.Choice(["auto", "mmap", "ring", "register"]),
    default="auto",
    show_default=True,
    help="Upload path on CUDA: auto takes mmap when the page cache holds the image, else ring (a CPU arena takes host copies).",
)
@click.option("--verify", is_flag=True, help="Recompute every payload digest (parallel) before uploading.")
@click.option("--no-graphs", is_flag=True, help="Turn CUDA graphs off (same as TFC_GRAPHS=0).")
@jobs_option(
    "Copy / reader / registration threads (default: mmap 12 C or 16 Python threads, at most the CPUs; "
    "ring and register 8).",
    old=("--threads",),
)
@click.option("--json", "as_json", is_flag=True, help="Print the phase timings as JSON.")
def load(image, rank, device, method, verify, no_graphs, jobs, as_json) -> None:
    """Open IMAGE (a rank or image folder), upload it to the device, capture graphs, print phase times.

    This is the first half of `tfc serve`: the rank's worker boots; on a GPU with graphs on it also builds
    the fast forward and captures its first decode graph (phases `model` and `graphs`), then stops.
    """
    from tfc.runtime.boot.phases import phases_path, write_phases
    from tfc.runtime.worker.worker import Worker

    with byte_bar("upload", sys.stderr.isatty() and not as_json) as update:
        worker = Worker.start(
            image,
            rank=rank,
            device=device,
            method=method,
            verify="full" if verify else None,
            graphs=False if no_graphs else None,
            jobs=jobs,
            progress=update,
        )
    booted = worker.booted
    try:
        model_note = _warm_up(worker)
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
            "graph_counts": graph_counts(booted.graphs),
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
        g = extra["graph_counts"]
        click.echo(f"graphs: {g['captures']} captured, {g['replays']} replayed{model_note}")
        if out is not None:
            click.echo(f"phase timings written to {out}", err=True)
    finally:
        worker.close()


def _warm_up(worker) -> str:
    """On a GPU with graphs on: the fast forward and its first graph; '' or why there is no model."""
    from tfc.errors import TfcError

    if worker.booted.arena.device.type != "cuda" or not worker.booted.graphs.enabled:
        return ""
    try:
        worker.load_model(dtype=None, kind="fast")
    except TfcError as error:
        return f" (no model: {str(error).splitlines()[0]})"
    worker.warm_up()
    return ""


def graph_counts(graphs) -> dict:
    """The graph cache's counters (what a fast forward captured and replayed)."""
    s = graphs.stats
    return {
        "enabled": graphs.enabled,
        "captures": s.captures,
        "replays": s.hits,
        "eager": s.eager,
        "held": s.held,
    }
