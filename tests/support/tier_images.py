"""The tiny pack prepared with a placement that puts its Engram rows off the device, through `tfc prepare`."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tfc.cli import cli

# Targets small enough for the tiny model: its hot weights and a 256-token KV fit, its two Engram tables do not
# (0.0255 GiB keeps layer 1's table on the device); a 0.1 MiB host budget sends both tables to NVMe.
TIERS = {
    "device": (),
    "host": ("--gpu-memory-gib", "0.025"),
    "mixed": ("--gpu-memory-gib", "0.0255"),
    "nvme": ("--gpu-memory-gib", "0.025", "--host-memory-gib", "0.0001"),
}
WANT = {
    "device": ("device", "device"),
    "host": ("host", "host"),
    "mixed": ("device", "host"),
    "nvme": ("nvme", "nvme"),
}
SMALL = ("--overhead-gib", "0", "--max-context", "256", "--max-seqs", "1")


def tier_image(pack: Path, store: Path, tier: str) -> Path:
    """The rank folder of the tiny pack prepared so its Engram rows land in `tier` (checked in the manifest)."""
    extra = (*TIERS[tier], *SMALL, "--nvme", str(store)) if TIERS[tier] else ()
    args = ["prepare", str(pack), "-o", str(store), "--engram-dir", str(pack), *extra]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    image = next(p for p in Path(store).iterdir() if p.is_dir() and not p.name.startswith("."))
    rank = image / "rank0"
    segments = json.loads((rank / "manifest.json").read_text())["segments"]
    tiers = tuple(s.get("tier", "device") for s in segments if s["name"].endswith(".engram.rows"))
    assert tiers == WANT[tier], (tier, tiers)
    return rank


def nvme_segment(rank: Path, layer: int) -> dict:
    """The manifest record of layer `layer`'s Engram rows."""
    segments = json.loads((rank / "manifest.json").read_text())["segments"]
    return next(s for s in segments if s["name"] == f"layers.{layer}.engram.rows")
