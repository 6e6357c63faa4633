"""The tiny pack prepared with a placement that puts its Engram rows off the device, through `tfc prepare`."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from tfc.cli import cli

# Targets small enough for the tiny model: its hot weights and a 256-token KV fit, its two Engram tables do not
# (0.0255 GiB keeps layer 1's table on the device); a 0.1 MiB host budget sends both tables to NVMe; at 0.02 GiB
# even the routed expert tables of layers 1, 3, 5 and 7 leave for host memory (cold experts).
TIERS = {
    "device": (),
    "host": ("--gpu-memory-gib", "0.025"),
    "mixed": ("--gpu-memory-gib", "0.0255"),
    "nvme": ("--gpu-memory-gib", "0.025", "--host-memory-gib", "0.0001"),
    "cold": ("--gpu-memory-gib", "0.02"),
}
WANT = {
    "device": ("device", "device"),
    "host": ("host", "host"),
    "mixed": ("device", "host"),
    "nvme": ("nvme", "nvme"),
    "cold": ("host", "host"),
}
COLD_LAYERS = (1, 3, 5, 7)
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
    cold = {
        int(s["name"].split(".")[1]) for s in segments if s.get("tier") == "host" and ".experts." in s["name"]
    }
    assert cold == (set(COLD_LAYERS) if tier == "cold" else set()), (tier, cold)
    return rank


def nvme_segment(rank: Path, layer: int) -> dict:
    """The manifest record of layer `layer`'s Engram rows."""
    segments = json.loads((rank / "manifest.json").read_text())["segments"]
    return next(s for s in segments if s["name"] == f"layers.{layer}.engram.rows")
