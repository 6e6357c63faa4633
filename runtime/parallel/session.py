"""A rank's life under a command: join the world and agree, boot, then lead (rank 0) or follow (the others)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfc.runtime.options import RuntimeOptions
from tfc.runtime.parallel.agreement import agree, rank_settings
from tfc.runtime.parallel.control import Leader, follow
from tfc.runtime.parallel.env import rank_env
from tfc.runtime.parallel.world import World

if TYPE_CHECKING:  # the worker's modules load after the early CUDA start
    from tfc.runtime.worker.worker import Worker


def device_kind(device: str | None) -> str:
    """`cuda` or `cpu`: what --device means for a rank (auto: CUDA when present)."""
    if device in (None, "auto"):
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def join_world(
    command: str, image: str | Path, device: str | None, options: RuntimeOptions, **settings: Any
) -> World | None:
    """This process's rank world, its settings agreed with every rank (the command's runtime options and the
    graph settings they give among them); None for a process that is no rank."""
    env = rank_env()
    if env is None:
        return None
    kind = device_kind(device)
    if env.rank != 0:  # the world stops through rank 0 (or its launcher), never by a signal to a follower
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
    world = World.join(env, kind, options)
    settings.update(runtime=options, graphs=options.graph_settings(kind))
    world.settings_digest = agree(
        world, rank_settings(image, env.rank, env.world, command, device=kind, **settings)
    )
    return world


def model_options(world: World | None) -> dict[str, Any]:
    """What a rank's `load_model` needs beyond TP=1's: its collectives."""
    return {} if world is None else {"comm": world.comm}


def lead_or_follow(world: World, worker: Worker) -> Leader:
    """Meet every rank; rank 0 gets the Leader its engine drives, the others follow it and exit 0 here."""
    world.wait_all("ready")
    if world.rank == 0:
        return Leader(worker, world)
    follow(worker, world)
    raise SystemExit(0)
