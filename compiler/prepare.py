"""`tfc prepare`: key the image, find it in the store, or plan and build every missing rank at once."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tfc.cache import format as image_format
from tfc.cache.key import image_key, source_hash
from tfc.cache.locks import building
from tfc.cache.writer import SPACE_MARGIN, ImageWriter, free_bytes
from tfc.compiler.build import Op, Reader, run_reads
from tfc.compiler.errors import BuildError
from tfc.compiler.family import planner_for
from tfc.compiler.identity import pack_identity
from tfc.compiler.placement import Budget, Placement
from tfc.compiler.segments import RankPlan, Zeros
from tfc.compiler.world_plan import plan_world

FILE_FOR_TOP = "top.bin"


def loader_sources() -> list[Path]:
    """Every source file whose text decides image bytes: the pack reader, the compiler, the format."""
    import tfc.cache
    import tfc.compiler
    import tfc.packs

    files = sorted(Path(tfc.packs.__file__).parent.glob("*.py")) + sorted(
        Path(tfc.compiler.__file__).parent.glob("*.py")
    )
    cache_dir = Path(tfc.cache.__file__).parent
    names = ("contract.py", "format.py", "manifest_parse.py", "writer.py", "publish.py", "digest.py")
    files += [cache_dir / name for name in names]
    return files


def loader_hash(paths: list[Path] | None = None) -> str:
    """The digest of the loader's own source text (part of every key)."""
    paths = paths or loader_sources()
    return source_hash(paths, base=Path(paths[0]).parent.parent)


@dataclass
class PrepareResult:
    """Where the image is and what this run did for each rank."""

    world_key: str
    path: Path
    world: int
    ranks: dict[int, str] = field(default_factory=dict)  # rank -> "hit" | "built"
    bytes_written: int = 0
    seconds: float = 0.0
    placement: Placement | None = (
        None  # where the built ranks' segments live (None when every rank was a hit)
    )


def key_inputs(
    pack, world: int, strict: bool, jobs: int, engram_dir: Path | None = None, budget: Budget | None = None
) -> dict:
    """Every input of the world key: format, loader source, pack identity, byte-changing options, the target."""
    extra = [
        p
        for p in (pack.config_path, pack.tokenizer_path, pack.root / "model.safetensors.index.json")
        if p and Path(p).exists()
    ]
    inputs = {
        "format_version": image_format.FORMAT_VERSION,
        "family": pack.family,
        "loader_hash": loader_hash(),
        "pack_identity": pack_identity(list(pack.shards), extra, strict=strict, jobs=jobs),
        "world": world,
        "options": {"natives": "held.v1", "expert_tables": "v1"},
    }
    if engram_dir is not None:
        tables = sorted(Path(engram_dir).glob("*.safetensors"))
        inputs["engram_identity"] = pack_identity(tables, [], strict=strict, jobs=jobs)
    if budget is not None:  # the tiers it decides are in the manifest, so another target is another image
        inputs["placement"] = budget.inputs()
    return inputs


def block_file(block: str) -> str:
    """The data file a block's segments live in."""
    if block == "top":
        return FILE_FOR_TOP
    kind, index = block.split(".")
    return f"{'L' if kind == 'layers' else 'M'}{int(index):02d}.bin"


def plan_json(plan: RankPlan, placement: Placement | None = None) -> dict:
    """The part of a rank plan recorded in its manifest: per block bytes, per segment attributes, the placement."""
    out = {
        "world": plan.world,
        "rank": plan.rank,
        "total": plan.total,
        "blocks": plan.bytes_by_block(),
        "engram_tables": any(s.kind == "engram_rows" for s in plan.segments),
        "attrs": {s.name: s.attrs for s in plan.segments if s.attrs},
    }
    record = placement.record() if placement is not None else None
    if record is not None:
        out["placement"] = record
    return out


def check_space(root: Path, plans: list[RankPlan]) -> None:
    """Refuse, before anything is created, a build the store's filesystem has no room for (holes take none)."""
    need = sum(seg.nbytes - seg.holes for plan in plans for seg in plan.segments)
    probe = Path(root)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = free_bytes(probe)
    if free < need + SPACE_MARGIN:
        raise BuildError(
            f"not enough free space in {root} for {len(plans)} rank image(s): {need / 1e9:.2f} GB to write + "
            f"{SPACE_MARGIN / 2**30:.0f} GiB margin, {free / 1e9:.2f} GB free; free space or use another --store"
        )


def build_ranks(
    pack,
    plans: list[RankPlan],
    root: Path,
    world_key: str,
    inputs: dict,
    jobs: int,
    progress: Callable[[int, int], None] | None = None,
    unchanged: Callable[[], None] | None = None,
    placement: Placement | None = None,
) -> dict[int, Path]:
    """Build the images of several ranks in one pass over the pack; publish each atomically."""
    tier = (placement or Placement(None)).tier
    fill_derived = planner_for(pack.family).fill_derived
    writers = {plan.rank: ImageWriter(root, world_key, plan.rank) for plan in plans}
    sinks: list[tuple[int, object]] = []
    ops: list[Op] = []
    try:
        for plan in plans:
            writer = writers[plan.rank]
            for seg in plan.segments:
                slot = writer.add_segment(
                    seg.name, seg.dtype, seg.shape, seg.layout, seg.nbytes, block_file(seg.block), tier(seg.name),
                    seg.holes,
                )  # fmt: skip
                sink = len(sinks)
                sinks.append((plan.rank, slot, seg))
                ops.extend(Op(copy, sink) for copy in seg.copies)
        lock = threading.Lock()

        def write(sink: int, dst: int, data: np.ndarray | Zeros) -> None:
            rank, slot, seg = sinks[sink]
            if dst + data.nbytes > seg.nbytes:
                raise BuildError(f"{seg.name}: write past its end ({dst} + {data.nbytes} > {seg.nbytes})")
            if isinstance(data, Zeros):
                writers[rank].write_zeros(slot, dst, data.nbytes)
            else:
                writers[rank].write(slot, dst, data)

        def count(sink: int, nbytes: int) -> None:
            if progress:
                with lock:
                    progress(sinks[sink][0], nbytes)

        reader = Reader()
        memo: dict = {}
        try:
            for index, (rank, slot, seg) in enumerate(sinks):
                if seg.const is not None:
                    writers[rank].write(slot, 0, np.frombuffer(seg.const, dtype=np.uint8))
                    count(index, len(seg.const))
                elif seg.derive is not None:
                    fill_derived(
                        seg,
                        reader,
                        lambda offset, data, i=index: write(i, offset, data) or count(i, data.nbytes),
                        memo,
                    )
        finally:
            reader.close()
        run_reads(ops, write, jobs, count)
        if unchanged is not None:
            unchanged()
        paths = {}
        for plan in plans:
            paths[plan.rank] = writers[plan.rank].publish(
                {
                    "family": pack.family,
                    "key": image_key({"world_key": world_key, "rank": plan.rank}),
                    "key_inputs": inputs,
                    "world": plan.world,
                    "plan": plan_json(plan, placement),
                    "meta": image_meta(pack),
                }
            )
        return paths
    except BaseException:
        for writer in writers.values():
            writer.abort()
        raise


def image_meta(pack) -> dict:
    """What the runtime reads instead of the pack: the model config and every backbone layer's mode record."""
    return {"pack_config": json_config(pack), "layer_modes": pack.config.layer_mode_records()}


def json_config(pack) -> dict:
    """The model config the runtime needs, as plain JSON (the runtime never reads the pack)."""
    import dataclasses

    cfg = pack.config
    return dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else dict(cfg)


def default_jobs() -> int:
    return max(4, min(16, 2 * (os.cpu_count() or 2)))


def sampled_identity(pack, jobs: int, engram_dir: Path | None) -> dict:
    """The cheap identity of a pack (and Engram folder) compared before and after a build."""
    inputs = key_inputs(pack, 1, False, jobs, engram_dir)
    return {"pack": inputs["pack_identity"], "engram": inputs.get("engram_identity")}


def find_rank(root: Path, world_key: str, rank: int) -> Path | None:
    """A published rank folder of this key, if one exists."""
    path = Path(root) / world_key[:16] / f"rank{rank}"
    return path if (path / image_format.MANIFEST_NAME).is_file() else None


def prepare(
    pack,
    root: Path,
    world: int,
    ranks: list[int] | None = None,
    jobs: int | None = None,
    strict_identity: bool = False,
    force: bool = False,
    engram_dir: Path | None = None,
    progress_factory: Callable[[dict[int, int]], Callable[[int, int], None]] | None = None,
    budget: Budget | None = None,
) -> PrepareResult:
    """Find or build the images of `ranks` (default: all) of a TP world, placed for `budget` (without one: all on
    the device); publish each atomically."""
    import time

    planner_for(pack.family).check_world(pack.config, world)
    ranks = list(range(world)) if ranks is None else sorted(set(ranks))
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise BuildError(f"rank(s) {', '.join(map(str, bad))} outside a TP world of {world}")
    jobs = jobs or default_jobs()
    started = time.perf_counter()
    inputs = key_inputs(pack, world, strict_identity, jobs, engram_dir, budget)
    world_key = image_key(inputs)
    result = PrepareResult(world_key, Path(root) / world_key[:16], world)
    if force and result.path.exists():
        from tfc.cache.store import ImageStore

        ImageStore(root).rm(world_key)  # refuses (ImageBusy) while a running process holds the image
    missing = [rank for rank in ranks if not find_rank(root, world_key, rank)]
    if missing:
        # every rank is planned (byte counts only where it is built already): placement weighs them all
        world_plan = plan_world(pack, world, budget, engram_dir, copies=missing)
        result.placement = world_plan.placement
        plans = [world_plan.plans[rank] for rank in missing]
        check_space(root, plans)
        # one builder of a key at a time: a second prepare waits, then finds what the first published
        try:
            with building(result.path):
                plans = [plan for plan in plans if not find_rank(root, world_key, plan.rank)]
                _build_missing(
                    pack, root, plans, world_key, inputs, jobs, engram_dir, progress_factory, result,
                    world_plan.placement,
                )  # fmt: skip
        finally:
            _drop_if_empty(result.path)
    for rank in ranks:
        result.ranks.setdefault(rank, "hit")
    result.seconds = time.perf_counter() - started
    return result


def _drop_if_empty(world_dir: Path) -> None:
    """Leave no empty image folder behind a build that published nothing (its lock files only)."""
    try:
        if world_dir.is_dir() and not any(p.name.startswith(("rank", ".tmp-")) for p in world_dir.iterdir()):
            for p in world_dir.iterdir():
                p.unlink()
            world_dir.rmdir()
    except OSError:
        pass  # another prepare may be using the folder right now; an empty folder is harmless


def _build_missing(
    pack, root, plans, world_key, inputs, jobs, engram_dir, progress_factory, result, placement
) -> None:
    """Build the planned ranks still missing, recording them in `result`."""
    if plans:
        totals = {plan.rank: plan.total for plan in plans}
        progress = progress_factory(totals) if progress_factory else None
        before = sampled_identity(pack, jobs, engram_dir)

        def unchanged() -> None:
            if sampled_identity(pack, jobs, engram_dir) != before:
                raise BuildError(
                    f"{pack.root}: the pack changed while it was being prepared; nothing was published"
                )

        build_ranks(pack, plans, Path(root), world_key, inputs, jobs, progress, unchanged, placement)
        for plan in plans:
            result.ranks[plan.rank] = "built"
        result.bytes_written = sum(totals.values())
