"""`tfc plan PACK --tp N`: the exact bytes every rank's image will hold and where they live, without writing anything."""

from __future__ import annotations

import json
import sys

import click

from tfc.cli.options import example, placement_options, tp_option


def plan_report(pack, world: int, budget=None) -> dict:
    """The stable `--json` shape: per rank, per block, bytes by kind, bytes by tier, plus totals and the placement."""
    from tfc.compiler.segments import KINDS
    from tfc.compiler.world_plan import plan_world

    planned = plan_world(pack, world, budget)
    placement = planned.placement
    ranks = []
    for rank, plan in enumerate(planned.plans):
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
                "tiers": placement.ranks[rank],
            }
        )
        if budget is not None:
            ranks[-1]["device_need"] = placement.device_need(rank)
            ranks[-1]["kv_room"] = placement.kv_room(rank)
    record = placement.record()
    if record is not None:
        record = {**record, "off_device": dict(sorted(placement.tiers.items()))}
    return {"world": world, "ranks": ranks, "placement": record}


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
    if report["placement"] is not None:
        for line in placement_lines(report):
            click.echo(line)


def placement_lines(report: dict) -> list[str]:
    """The placement in words: the target, then per rank its bytes by tier and the GPU memory left for KV."""
    GIB = 1 << 30
    record = report["placement"]
    got = record["inputs"]
    host = (
        "no host limit"
        if got["host_memory_gib"] is None
        else f"{got['host_memory_gib']:g} GiB of host memory"
    )
    nvme = f", NVMe at {got['nvme_dir']}" if got["nvme_dir"] else ""
    lines = [
        f"placement for {report['world']} GPU(s) of {got['gpu_memory_gib']:g} GiB, {host}{nvme}; KV for "
        f"{got['max_seqs']} sequences of {got['max_context']:,} tokens ({record['kv_bytes'] / GIB:.2f} GiB a rank), "
        f"{record['overhead_bytes'] / GIB:g} GiB overhead"
    ]
    if record["cold_layers"]:
        layers = ", ".join(map(str, record["cold_layers"]))
        lines.append(f"cold experts: the routed expert tables of layers {layers} in host memory")
    rows = [name for name in record["off_device"] if name.endswith(".engram.rows")]
    if rows:
        lines.append("Engram rows: " + ", ".join(f"{name} in {record['off_device'][name]}" for name in rows))
    for rank in report["ranks"]:
        tiers = rank["tiers"]
        lines.append(
            f"rank {rank['rank']}: device {tiers['device'] / GIB:.1f} GiB, host {tiers['host'] / GIB:.1f} GiB, "
            f"nvme {tiers['nvme'] / GIB:.1f} GiB; GPU memory left for KV {rank['kv_room'] / GIB:.1f} GiB "
            f"(the stated sequences take {record['kv_bytes'] / GIB:.2f})"
        )
    return lines


@click.command(
    "plan",
    epilog=example(
        "tfc plan ./pack --tp 4 --json", "tfc plan ./pack --tp 2 --gpu-memory-gib 141 --max-context 4096"
    ),
)
@click.argument("pack_path", metavar="PACK", type=click.Path(exists=True, file_okay=False))
@tp_option()
@placement_options()
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan(pack_path: str, world: int, budget, as_json: bool) -> None:
    """Print every rank's bytes by kind and block, exactly what `tfc prepare` will write, and with
    --gpu-memory-gib where each segment lives on that target (device, pinned host memory or NVMe)."""
    from tfc.packs.pack import open_pack

    report = plan_report(open_pack(pack_path), world, budget)
    if as_json:
        json.dump(report, sys.stdout)
        sys.stdout.write("\n")
    else:
        _human(report)
