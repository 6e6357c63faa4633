"""What load, generate and serve share for a TP=N image: start every rank from the one command a user typed."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from tfc.errors import TfcError


class WorldImageError(TfcError):
    """An image path that cannot start a rank world (a rank folder of a TP=N image, say)."""


def image_world(image: Path) -> int:
    """The TP world an image was prepared for (1 for a path that is not an image: the boot says why)."""
    from tfc.cache.errors import ImageError
    from tfc.cache.format import RankManifest
    from tfc.cache.image_check import rank_folders

    try:
        is_world, folders = rank_folders(Path(image))
        world = RankManifest.load(next(iter(folders.values()))).world
    except (ImageError, OSError):
        return 1
    if world > 1 and not is_world:
        raise WorldImageError(
            f"{image} is one rank folder of a TP={world} image; pass the image folder ({Path(image).parent}) "
            "to run every rank"
        )
    return world


def argv_of(ctx: click.Context) -> list[str]:
    """The command line that gives this command these parameters (each rank runs it again)."""
    args: list[str] = [ctx.info_name or ctx.command.name]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if isinstance(param, click.Argument):
            args.append(str(value))
        elif not isinstance(param, click.Option) or value is None or param.is_eager:
            continue
        elif param.is_flag:
            if value:
                args.append(_spelling(param))
        elif param.multiple:
            for v in value:
                args += [_spelling(param), str(v)]
        else:
            args += [_spelling(param), str(value)]
    return args


def _spelling(param: click.Option) -> str:
    """The option's first long spelling (an alias's old names stay out of it)."""
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def launch_if_world(ctx: click.Context, image: Path) -> None:
    """On a TP=N image run every rank on this host and exit with the world's code; a rank process returns."""
    from tfc.runtime.parallel.env import rank_env

    env = rank_env()
    world = env.world if env is not None else image_world(image)
    if env is not None or world == 1:
        return  # a TP=1 run, or this process is a rank (tfc's launcher or torchrun started it)
    from tfc.runtime.parallel.launch import launch

    sys.exit(launch(argv_of(ctx), world))
