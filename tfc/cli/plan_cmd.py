"""`tfc plan PACK --tp N`: the exact bytes every rank's image will hold, without writing anything."""

from __future__ import annotations

import json
import sys

import click

from tfc.cli.options import example, tp_option


def plan_report(pack, world: int) -> dict:
    """The stable `--json` shape: per rank, per block, bytes by kind, plus totals."""
    from tfc.compiler.family import planner_for
    from tfc.compiler.segments import KINDS

    planner = planner_for(pack.family)
    ranks = []
    for rank in range(world):
        plan = planner.plan_rank(pack, world, rank, with_copies=False)
        blocks = plan.bytes_by_block()
        layers = []
        for index in range(pack.config.num_blocks):
            block = pack.config.block_prefix(index)
            layers.append(
                {"layer": index, "block": block, "bytes": blocks.get(block, dict.fromkeys(KINDS, 0))}
            )
        ranks.append(
            {
                "rank": rank,
                "total": plan.total,
                "layers": layers,
                "top": blocks.get("top", dict.fromkeys(KINDS, 0)),
                "segments": len(plan.segments),
            }
        )
    return {"world": world, "ranks": ranks}


SHORT = {
    "routed_trellis": "routed",
    "shared_trellis": "shared",
    "other_trellis": "trellis",
    "scales": "scales",
    "natives": "native",
    "tables": "tables",
    "engram_rows": "engram",
    "engram_assets": "assets",
    "tokenizer": "tokenizer",
}


def human_bytes(n: int) -> str:
    """Bytes in decimal units, three significant figures."""
    for unit, size in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _human(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from tfc.compiler.segments import KINDS

    console = Console()
    ranks = report["ranks"]
    shown = [
        k for k in KINDS if any(r["top"][k] or any(layer["bytes"][k] for layer in r["layers"]) for r in ranks)
    ]
    for rank in ranks:
        title = f"rank {rank['rank']} of {report['world']}: {rank['total']:,} bytes ({human_bytes(rank['total'])})"
        table = Table(title=title, title_justify="left", box=None, pad_edge=False)
        table.add_column("block")
        for kind in shown:
            table.add_column(SHORT[kind], justify="right")
        table.add_column("total", justify="right")
        rows = [(layer["block"], layer["bytes"]) for layer in rank["layers"]] + [("top", rank["top"])]
        for block, kinds in rows:
            table.add_row(block, *(human_bytes(kinds[k]) for k in shown), human_bytes(sum(kinds.values())))
        console.print(table)
    console.print("bytes in decimal units; `--json` gives every count exact to the byte", style="dim")


@click.command("plan", epilog=example("tfc plan ./pack --tp 4 --json"))
@click.argument("pack_path", metavar="PACK", type=click.Path(exists=True, file_okay=False))
@tp_option()
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(pack_path: str, world: int, as_json: bool) -> None:
    """Print every rank's bytes by kind and block, exactly what `tfc prepare` will write."""
    from tfc.packs.pack import open_pack

    report = plan_report(open_pack(pack_path), world)
    if as_json:
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
    else:
        _human(report)
