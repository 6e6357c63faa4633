"""Before any rank boots, every rank compares what must match; one line names the first thing that differs.

What must match: the tfc version, the command, the world and the image (its world key: one prepare of
one pack for one world), the device kind, and the options every rank applies alike (dtype, Engram, slots,
context, the runtime options that its flags and the operator's settings gave (runtime/options.py), the
graph-cache settings and bucket lists). Every rank reruns the command line it was given, so its flags are
rank 0's; a setting exported on one host and not another is refused here, by its option's name. A rank
that cannot start (no rank folder of its number, an image for another world) says why through the same
exchange, so every rank refuses together.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tfc import __version__
from tfc.errors import TfcError


class SettingsMismatch(TfcError):
    """Ranks started with different images, worlds or options, or one rank cannot start."""


def rank_settings(image: str | Path, rank: int, world: int, command: str, **options: Any) -> dict[str, Any]:
    """This rank's view of what it will run (or {"error": why} when it cannot start)."""
    from tfc.cache.format import RankManifest
    from tfc.runtime.boot.image_open import resolve_rank_dir

    try:
        m = RankManifest.load(resolve_rank_dir(image, rank))
        if (m.world, m.rank) != (world, rank):
            raise SettingsMismatch(
                f"{image}: the image is rank {m.rank} of a TP={m.world} image, not rank {rank} of {world}"
            )
    except TfcError as error:
        return {"error": str(error)}
    settings = {"tfc": __version__, "command": command, "world": world, "image": m.world_key}
    for name, value in options.items():
        if hasattr(value, "__dataclass_fields__"):  # e.g. GraphSettings: compared field by field
            settings.update({f"{name}.{k}": _plain(v) for k, v in asdict(value).items()})
        else:
            settings[name] = _plain(value)
    return settings


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def settings_digest(settings: dict[str, Any]) -> str:
    """SHA-256 of the canonical JSON of what every rank agreed on."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def agree(world: Any, mine: dict[str, Any]) -> str:
    """Refuse on every rank unless every rank's settings equal rank 0's; the agreed digest."""
    every = world.gather_objects(mine)
    problem = _first_difference(every)
    if problem is None:
        return settings_digest(every[0])
    world.quiet()  # every rank refuses now: none of them is a failure the others must react to
    if world.rank == 0:
        world.close()
        raise SettingsMismatch(problem)
    os._exit(
        2
    )  # quietly (rank 0 speaks for the world), before a torn-down peer can abort the group's teardown


def _first_difference(every: list[dict[str, Any]]) -> str | None:
    for rank, settings in enumerate(every):
        if "error" in settings:
            return f"rank {rank} cannot start: {settings['error']}"
    first = every[0]
    for rank, settings in enumerate(every[1:], 1):
        for key in sorted(set(first) | set(settings)):
            if first.get(key) != settings.get(key):
                return (
                    f"ranks disagree on {key}: rank 0 has {_show(first.get(key))}, rank {rank} has "
                    f"{_show(settings.get(key))}; start every rank with the same image and options"
                )
    return None


def _show(value: Any) -> str:
    text = json.dumps(value) if value is not None else "nothing"
    return text if len(text) <= 40 else text[:16] + "…"
