"""`tfc cache ls | rm KEY | prune`: the image store (never removes an image a running process holds)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import click

from tfc.cli.options import example, store_option

_UNITS = {
    "": 1,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
    "ki": 2**10,
    "mi": 2**20,
    "gi": 2**30,
    "ti": 2**40,
}


def parse_bytes(text: str) -> int:
    """'500G', '1.5TiB', '123' -> bytes (decimal units, binary with i)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]i?)?b?\s*", text.lower())
    if not m:
        raise click.BadParameter(f"{text!r} is not a size like 500G, 1.5TiB or 1000000")
    size = float(m.group(1)) * _UNITS[m.group(2) or ""]
    if not size < 2**63:  # also inf, from a few hundred digits
        raise click.BadParameter(f"{text[:40]!r} is more bytes than any store holds")
    return int(size)


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    return None if value is None else parse_bytes(value)


def _store(ctx: click.Context, store: str | None):
    """The store a subcommand names, else the one `tfc cache --store` names, else the default."""
    from tfc.cache.store import ImageStore

    root = store if store is not None else ctx.obj
    return ImageStore(Path(root) if root is not None else None)


@click.group("cache", epilog=example("tfc cache ls --store /data/tfc-images"))
@store_option(old=("--root",))
@click.pass_context
def cache(ctx: click.Context, store: str | None) -> None:
    """List, remove and prune prepared images (--store may come before or after the subcommand)."""
    ctx.obj = store


@cache.command("ls", epilog=example("tfc cache ls --json"))
@store_option(old=("--root",))
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
@click.pass_context
def ls(ctx: click.Context, store: str | None, as_json: bool) -> None:
    """List images, most recently used first: key, family, world, ranks, size, age, state."""
    from tfc.cache.store import age

    images = _store(ctx, store)
    infos = images.ls()
    if as_json:
        click.echo(json.dumps({"root": str(images.root), "images": [i.to_dict() for i in infos]}, indent=1))
        return
    if not infos:
        click.echo(f"no images in {images.root}")
        return
    from rich.console import Console
    from rich.table import Table

    now = time.time()
    table = Table(title=str(images.root), title_justify="left")
    for col in ("key", "family", "world", "ranks", "size", "created", "used", "state"):
        table.add_column(col, justify="right" if col in ("size", "created", "used") else "left")
    for i in infos:
        state = [
            "held" if i.held else "",
            "complete" if i.complete else "partial",
            f"{i.building} building" if i.building else "",
        ]
        if i.error:
            state.append("damaged manifest")
        table.add_row(
            i.key, i.family or "?", str(i.world or "?"), ",".join(map(str, i.ranks)) or "-", f"{i.bytes / 1e9:.2f} GB",
            age(i.created, now), age(i.last_used, now), " ".join(s for s in state if s),
        )  # fmt: skip
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # pipes get whole keys, not an 80-column squeeze
    console.print(table)


@cache.command("rm", epilog=example("tfc cache rm 263e81d4"))
@click.argument("key")
@store_option(old=("--root",))
@click.pass_context
def rm(ctx: click.Context, key: str, store: str | None) -> None:
    """Remove the image whose key starts with KEY (refused while a process holds it)."""
    path = _store(ctx, store).rm(key)
    click.echo(f"removed {path}")


@cache.command("prune", epilog=example("tfc cache prune --max-bytes 500G --dry-run"))
@store_option(old=("--root",))
@click.option("--keep", type=click.IntRange(0), default=None, help="Keep the N most recently used images.")
@click.option(
    "--max-bytes",
    type=str,
    default=None,
    callback=_size,
    help="Remove least recently used images until the rest fit, e.g. 500G.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed, remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
@click.pass_context
def prune(
    ctx: click.Context,
    store: str | None,
    keep: int | None,
    max_bytes: int | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Remove least recently used images; images held by a running process are skipped and named."""
    from tfc.cache.errors import ImageError

    if keep is None and max_bytes is None:
        raise ImageError("prune needs --keep N or --max-bytes B")
    result = _store(ctx, store).prune(keep=keep, max_bytes=max_bytes, dry_run=dry_run)
    if as_json:
        click.echo(
            json.dumps(
                {k: [i.to_dict() for i in getattr(result, k)] for k in ("removed", "held", "kept")}, indent=1
            )
        )
        return
    verb = "would remove" if dry_run else "removed"
    for i in result.removed:
        click.echo(f"{verb} {i.key} ({i.bytes / 1e9:.2f} GB)")
    for i in result.held:
        click.echo(f"skipped {i.key} ({i.bytes / 1e9:.2f} GB): held by a running process")
    click.echo(f"{len(result.removed)} {verb}, {len(result.held)} held, {len(result.kept)} kept")
