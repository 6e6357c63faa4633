"""`tfc dequant PACK GROUP -o W.npy`: one EXL3 group's dense weight [in, out] float32 (reference decode)."""

from __future__ import annotations

import difflib
import json
from pathlib import Path

import click

from tfc.cli.options import example
from tfc.errors import TfcError


class UnknownGroup(TfcError):
    """The pack has no EXL3 group of that name."""


def _suggest(name: str, names: list[str]) -> str:
    close = difflib.get_close_matches(name, names, n=4, cutoff=0.6)
    if not close:  # fall back to groups sharing the longest dotted prefix
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            prefix = ".".join(parts[:cut]) + "."
            close = sorted(n for n in names if n.startswith(prefix))[:4]
            if close:
                break
    return f"; did you mean {', '.join(close)}?" if close else ""


@click.command("dequant", epilog=example("tfc dequant ./pack layers.0.ffn.experts.0.w1 -o w1.npy"))
@click.argument("pack", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.argument("group")
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The .npy file."
)
@click.option(
    "--rotated", is_flag=True, help="Write the rotated-domain tiles W-hat (fp16 values) instead of W."
)
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def dequant(pack: Path, group: str, output: Path, rotated: bool, as_json: bool) -> None:
    """Decode one EXL3 group of PACK to a dense [in_features, out_features] float32 .npy (no GPU needed)."""
    import numpy as np
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from tfc.kernels.exl3 import reference as ref
    from tfc.kernels.exl3.codebook import codebook_id
    from tfc.packs.pack import open_pack, read_tensor

    groups = open_pack(pack).groups
    g = groups.get(group)
    if g is None:
        raise UnknownGroup(f"{pack}: no EXL3 group named {group!r}{_suggest(group, list(groups))}")
    cb = codebook_id(g.codebook)
    ref.check_width(g.width, cb)
    trellis = read_tensor(g.trellis)
    suh = read_tensor(g.suh) if g.suh is not None else ref.signs_from_packed(read_tensor(g.su))
    svh = read_tensor(g.svh) if g.svh is not None else ref.signs_from_packed(read_tensor(g.sv))
    out = np.lib.format.open_memmap(output, mode="w+", dtype=np.float32, shape=(g.k, g.n))
    rows = 1024
    progress = Progress(
        TextColumn(f"dequant {group}"),
        BarColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with progress:
        task = progress.add_task("rows", total=g.k)
        if rotated:
            for row0 in range(0, g.k, rows):
                block = ref.decode_rotated(trellis[row0 // 16 : (row0 + rows) // 16], cb)
                out[row0 : row0 + block.shape[0]] = block
                progress.advance(task, block.shape[0])
        else:
            for row0, block in ref.iter_dequant(trellis, suh, svh, cb, rows=rows):
                out[row0 : row0 + block.shape[0]] = block
                progress.advance(task, block.shape[0])
    out.flush()
    del out
    info = {"group": group, "file": str(output), "shape": [g.k, g.n], "dtype": "float32", "bits": g.bits,
            "codebook": g.codebook, "rotated": rotated}  # fmt: skip
    if as_json:
        click.echo(json.dumps(info))
    else:
        what = "W-hat (rotated domain)" if rotated else "W"
        click.echo(f"{output}: {group} {what} [{g.k}, {g.n}] float32 ({g.bits:g} bits, {g.codebook})")
