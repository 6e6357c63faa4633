"""`tfc cache ls | rm KEY | prune`: the image store (never removes an image a running process holds)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import click

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
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def _store(ctx: click.Context):
    from tfc.cache.store import ImageStore

    return ImageStore(ctx.obj)


@click.group("cache")
@click.option(
    "--root",
    type=click.Path(path_type=Path),
    default=None,
    help="Store folder (default: $TFC_CACHE or ~/.cache/tfc/images).",
)
@click.pass_context
def cache(ctx: click.Context, root: Path | None) -> None:
    """List, remove and prune prepared images."""
    ctx.obj = root


@cache.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
@click.pass_context
def ls(ctx: click.Context, as_json: bool) -> None:
    """List images, most recently used first: key, family, world, ranks, size, age, state."""
    from tfc.cache.store import age

    store = _store(ctx)
    infos = store.ls()
    if as_json:
        click.echo(json.dumps({"root": str(store.root), "images": [i.to_dict() for i in infos]}, indent=1))
        return
    if not infos:
        click.echo(f"no images in {store.root}")
        return
    from rich.console import Console
    from rich.table import Table

    now = time.time()
    table = Table(title=str(store.root), title_justify="left")
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


@cache.command("rm")
@click.argument("key")
@click.pass_context
def rm(ctx: click.Context, key: str) -> None:
    """Remove the image whose key starts with KEY (refused while a process holds it)."""
    path = _store(ctx).rm(key)
    click.echo(f"removed {path}")


@cache.command("prune")
@click.option("--keep", type=click.IntRange(0), default=None, help="Keep the N most recently used images.")
@click.option(
    "--max-bytes",
    type=str,
    default=None,
    help="Remove least recently used images until the rest fit, e.g. 500G.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be removed, remove nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
@click.pass_context
def prune(ctx: click.Context, keep: int | None, max_bytes: str | None, dry_run: bool, as_json: bool) -> None:
    """Remove least recently used images; images held by a running process are skipped and named."""
    from tfc.cache.errors import ImageError

    if keep is None and max_bytes is None:
        raise ImageError("prune needs --keep N or --max-bytes B")
    limit = parse_bytes(max_bytes) if max_bytes is not None else None
    result = _store(ctx).prune(keep=keep, max_bytes=limit, dry_run=dry_run)
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
