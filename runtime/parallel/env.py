"""The launcher variables a rank reads (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT), as torchrun sets
them, and the two tfc's own launcher adds (TFC_LAUNCHER, TFC_LAUNCH_T0: internal, in tfc/settings.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

from tfc import settings
from tfc.errors import TfcError

EXIT_LOST = 70  # a rank died, hung or failed: the whole world exits with this code


class RankEnvError(TfcError):
    """Launcher variables that are missing, not numbers, or inconsistent."""


@dataclass(frozen=True)
class RankEnv:
    """One rank's place in its world and where the world meets."""

    rank: int
    world: int
    local_rank: int
    local_world: int
    master_addr: str
    master_port: int
    launched: bool = False  # by `tfc` itself (its pipe on stdin), not by torchrun
    run_id: str = ""


def since_launch(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds since the world was launched (TFC_LAUNCH_T0, wall time), or None when no launcher set it."""
    t0 = settings.get("TFC_LAUNCH_T0", environ)
    return None if t0 is None else round(time.time() - t0, 6)


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise RankEnvError(
                f"{name} is not set (a rank needs RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT)"
            )
        return default
    try:
        return int(raw)
    except ValueError:
        raise RankEnvError(f"{name}={raw!r} is not a whole number") from None


def rank_env(environ: Mapping[str, str] | None = None) -> RankEnv | None:
    """This process's rank, or None when no launcher started it (no RANK/WORLD_SIZE, or a world of one)."""
    env = os.environ if environ is None else environ
    if "RANK" not in env and "WORLD_SIZE" not in env:
        return None
    world = _int(env, "WORLD_SIZE")
    rank = _int(env, "RANK")
    if world < 1 or not 0 <= rank < world:
        raise RankEnvError(f"RANK={rank} is not a rank of WORLD_SIZE={world}")
    if world == 1:
        return None
    local_world = _int(env, "LOCAL_WORLD_SIZE", world)
    local_rank = _int(env, "LOCAL_RANK", rank % local_world)
    if not 0 <= local_rank < local_world:
        raise RankEnvError(f"LOCAL_RANK={local_rank} is not a rank of LOCAL_WORLD_SIZE={local_world}")
    addr = env.get("MASTER_ADDR") or ""
    if not addr:
        raise RankEnvError("MASTER_ADDR is not set (the host of rank 0 or of the launcher's store)")
    port = _int(env, "MASTER_PORT")
    if not 0 < port < 65536:
        raise RankEnvError(f"MASTER_PORT={port} is not a port")
    launcher = settings.get("TFC_LAUNCHER", env)  # tfc's launcher names its world's run
    run = launcher or env.get("TORCHELASTIC_RUN_ID") or f"{addr}:{port}"
    run += f".{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return RankEnv(rank, world, local_rank, local_world, addr, port, bool(launcher), run)
