"""What a prepared image holds, from its manifests alone: key, world, ranks, bytes by kind and layout."""

from __future__ import annotations

from collections import Counter
from pathlib import Path


def is_image(path: Path) -> bool:
    """A rank folder (manifest.json) or a world folder (rank* folders), not a pack (config.json)."""
    if (path / "config.json").exists():
        return False
    return (path / "manifest.json").exists() or any(p.name.startswith("rank") for p in path.iterdir())


def summarize_image(path: Path) -> dict:
    """Per rank: key, bytes by kind (from the plan), segments by layout, Engram tables present."""
    from tfc.cache.format import RankManifest
    from tfc.cache.verify import rank_folders

    _, folders = rank_folders(path)
    ranks = []
    first = None
    for rank, folder in folders.items():
        m = RankManifest.load(folder)
        first = first or m
        kinds: Counter = Counter()
        for block in (m.plan.get("blocks") or {}).values():
            kinds.update(block)
        ranks.append(
            {
                "rank": m.rank if rank is None else rank,
                "key": m.key,
                "segments": len(m.segments),
                "files": len(m.files),
                "bytes": m.total_bytes,
                "bytes_by_kind": {k: v for k, v in kinds.items() if v},
                "layouts": dict(Counter(s.layout for s in m.segments)),
                "engram_tables": bool(m.plan.get("engram_tables")),
                "bytes_by_tier": _tiers(m),
                "placed_for": (m.plan.get("placement") or {}).get("inputs"),
            }
        )
    identity = (first.key_inputs or {}).get("pack_identity", {})
    return {
        "image": str(path),
        "family": first.family,
        "format_version": first.format_version,
        "world_key": first.world_key,
        "world": first.world,
        "ranks_present": [r["rank"] for r in ranks],
        "loader_hash": (first.key_inputs or {}).get("loader_hash"),
        "pack_identity": identity,
        "ranks": ranks,
    }


def _tiers(m) -> dict[str, int]:
    """Segment bytes by tier (device, host, nvme)."""
    from tfc.cache.contract import TIERS

    out = dict.fromkeys(TIERS, 0)
    for seg in m.segments:
        out[seg.tier] += seg.length
    return out


def image_text(s: dict) -> str:
    """The human form of summarize_image."""
    ident = s["pack_identity"]
    lines = [
        f"image    {s['image']}  ({s['family']}, format {s['format_version']}, TP world {s['world']}, "
        f"ranks present {s['ranks_present']})",
        f"key      {s['world_key']}",
        f"loader   {s['loader_hash']}",
        f"pack     {ident.get('digest')} ({ident.get('mode')} identity, {ident.get('shards')} shards, "
        f"{ident.get('bytes', 0) / 1e9:,.2f} GB)",
    ]
    for r in s["ranks"]:
        lines.append(
            f"rank {r['rank']}   {r['bytes'] / 1e9:,.3f} GB in {r['files']} files, {r['segments']} segments, "
            f"Engram tables {'present' if r['engram_tables'] else 'absent'}"
        )
        lines += [f"  {k:<16} {v:>16,}" for k, v in r["bytes_by_kind"].items()]
        if r["placed_for"] is not None:
            tiers = ", ".join(f"{k} {v:,}" for k, v in r["bytes_by_tier"].items())
            lines.append(f"  placed   {tiers} bytes, for a {r['placed_for'].get('gpu_memory_gib')} GiB GPU")
        lines.append("  layouts  " + ", ".join(f"{k} {v}" for k, v in sorted(r["layouts"].items())))
    return "\n".join(lines)
