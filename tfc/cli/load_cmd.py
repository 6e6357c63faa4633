"""`tfc load IMAGE`: open, upload and capture one rank, print each phase's time, exit."""

from __future__ import annotations

import json
import sys

import click

from tfc.cli.options import device_option, example, jobs_option
from tfc.cli.progress import byte_bar
from tfc.cli.world_cmd import launch_if_world


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
@click.option("--no-graphs", is_flag=True, help="Turn CUDA graphs off (every step eager).")
@jobs_option(
    "Copy / reader / registration threads (default: mmap 12 C or 16 Python threads, at most the CPUs; "
    "ring and register 8).",
    old=("--threads",),
)
@click.option("--json", "as_json", is_flag=True, help="Print the phase timings as JSON.")
def load(image, rank, device, method, verify, no_graphs, jobs, as_json) -> None:
    """Open IMAGE (a rank or image folder), upload it to the device, capture graphs, print phase times.

    This is the first half of `tfc serve`: the rank's worker boots; on a GPU with graphs on it also builds
    the fast forward and captures its first decode graph (phases `model` and `graphs`), then stops. An image
    prepared with --tp N (and no --rank) boots all N ranks at once, one process each, and reports each.
    """
    from tfc.runtime.options import RuntimeOptions
    from tfc.runtime.parallel.env import since_launch

    started = since_launch()  # before torch is imported: what the rest costs is the boot's
    options = RuntimeOptions.from_settings(graphs=not no_graphs)  # a bad setting: one line, before any work
    if rank is None:
        launch_if_world(click.get_current_context(), image)
    from tfc.runtime.engine.warmup import runner_notes, stage_kernels, stages_line
    from tfc.runtime.parallel.session import join_world, lead_or_follow
    from tfc.runtime.worker.worker import Worker

    world = None if rank is not None else join_world("load", image, device, options, verify=verify)
    joined = since_launch() if world is not None else None
    with byte_bar(
        "upload", sys.stderr.isatty() and not as_json and (world is None or world.rank == 0)
    ) as update:
        worker = Worker.start(
            image,
            rank=rank if world is None else world.rank,
            device=device if world is None else world.device,
            method=method,
            verify="full" if verify else None,
            options=options,
            jobs=jobs,
            progress=update,
        )
    booted = worker.booted
    leader = None
    try:
        model_note = _warm_up(worker) if world is None else ""
        resident = {"rank": booted.image.manifest.rank, "started_s": started, "joined_s": joined,
                    "resident_s": since_launch(), "wall_ms": booted.phases.to_dict()["wall_ms"]}  # fmt: skip
        ranks = [resident] if world is None else world.gather_objects(resident)
        if world is not None:
            leader = lead_or_follow(world, worker)  # the other ranks exit 0 once rank 0 has reported
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
            "stage_kernels": stage_kernels(worker.runner),
            "notes": runner_notes(worker.runner),
            "started_s": started,
            "resident_s": resident["resident_s"],
        }
        if world is not None:
            extra["ranks"] = ranks
            extra["settings_digest"] = world.settings_digest
            extra["world_resident_s"] = _latest(ranks)
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
        if extra["stage_kernels"]:
            click.echo(stages_line(extra["stage_kernels"]))
        for note in extra["notes"]:
            click.echo(f"note: {note}")
        if world is not None:
            own = ", ".join(f"rank {r['rank']} {r['wall_ms'] / 1e3:.2f} s" for r in ranks)
            when = extra["world_resident_s"]
            after = f" {when:.2f} s after launch" if when is not None else ""
            click.echo(f"TP={m.world}: every rank resident{after} (own boots: {own})")
    finally:
        if leader is not None:
            leader.stop()  # every other rank exits 0
        worker.close()


def _latest(ranks: list[dict]) -> float | None:
    """When the last rank became resident (seconds after launch), if the launch time is known."""
    times = [r["resident_s"] for r in ranks]
    return None if None in times else max(times)


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
