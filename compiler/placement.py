"""Placement decided ahead of time: for a stated GPU and host memory, the tier every segment of every rank lives in.

Device first for everything the hot path reads every step; then the routed experts, moving whole layers'
tables to pinned host memory ("cold experts") only when the rest would not fit, the fewest layers that make
it fit, spread evenly over the backbone; then the Engram table rows, on the device while room is left,
else in host memory while the host budget lasts, else on NVMe when a folder was given. Every rank gets the
same tiers (the largest rank decides), so ranks stay in step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tfc.cache.contract import TIER_DEVICE, TIERS
from tfc.compiler.errors import PlanError
from tfc.compiler.segments import RankPlan, SegmentPlan

GIB = 1 << 30
DEFAULT_CONTEXT = 65536  # tokens a sequence may reach: the fast runner's default
DEFAULT_SEQS = 16  # sequences served at once: `tfc serve --max-seqs`'s default
# CUDA context, cuBLAS and Triton workspaces, captured graphs' pools, NCCL buffers, step buffers, the prefill
# scratch and the prefix cache's default 1 GiB: what the runtime holds besides the arena and the KV memory.
DEFAULT_OVERHEAD_GIB = 6.0
ENGRAM, EXPERTS = "engram", "experts"


class PlacementError(PlanError):
    """A target whose memory cannot hold the model as planned; the message names what to change."""


@dataclass(frozen=True)
class Budget:
    """What the target has (GPU memory a rank, host memory the ranks may pin together, an NVMe folder) and
    what the device must keep free besides the weights (KV for the stated sequences, a stated overhead)."""

    gpu_gib: float
    host_gib: float | None = None
    nvme_dir: str | None = None
    max_context: int = DEFAULT_CONTEXT
    max_seqs: int = DEFAULT_SEQS
    overhead_gib: float = DEFAULT_OVERHEAD_GIB

    def __post_init__(self) -> None:
        for name in ("gpu_gib", "host_gib", "overhead_gib"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < 1 << 20:
                raise PlacementError(f"{name.replace('_', ' ')} {value} is not a size in GiB")
            if value is not None:  # 141 and 141.0 are one target, and one image key
                object.__setattr__(self, name, float(value))
        if self.max_context < 1 or self.max_seqs < 1:
            raise PlacementError("--max-context and --max-seqs must be at least 1")
        if self.nvme_dir is not None:
            object.__setattr__(self, "nvme_dir", os.path.abspath(self.nvme_dir))

    def inputs(self) -> dict:
        """The plan's inputs as plain JSON: recorded in every manifest and part of the image key."""
        return {
            "gpu_memory_gib": self.gpu_gib,
            "host_memory_gib": self.host_gib,
            "nvme_dir": self.nvme_dir,
            "max_context": self.max_context,
            "max_seqs": self.max_seqs,
            "overhead_gib": self.overhead_gib,
        }


@dataclass(frozen=True)
class Movable:
    """A segment that may leave the device: an Engram layer's rows, or a backbone layer's routed expert table."""

    role: str  # ENGRAM | EXPERTS
    layer: int


@dataclass(frozen=True)
class PlacementRules:
    """What a family tells placement: which segments may leave the device, and its KV bytes per rank."""

    movable: Callable[[SegmentPlan], Movable | None]
    kv_bytes: Callable[[Any, int, int], int]  # (config, sequences, context) -> bytes


@dataclass(frozen=True)
class Placement:
    """Every segment's tier (those not named are on the device), the reserve and each rank's bytes by tier."""

    budget: Budget | None
    tiers: Mapping[str, str] = field(default_factory=dict)
    kv_bytes: int = 0
    overhead_bytes: int = 0
    cold_layers: tuple[int, ...] = ()
    ranks: tuple[dict[str, int], ...] = ()

    def tier(self, name: str) -> str:
        """The tier of a segment."""
        return self.tiers.get(name, TIER_DEVICE)

    def device_need(self, rank: int) -> int:
        """GPU memory a rank needs: its device tier, the KV reserve and the overhead."""
        return self.ranks[rank]["device"] + self.kv_bytes + self.overhead_bytes

    def kv_room(self, rank: int) -> int | None:
        """GPU memory left for KV on a rank once its device tier and the overhead are in (None: no budget)."""
        if self.budget is None:
            return None
        return int(self.budget.gpu_gib * GIB) - self.ranks[rank]["device"] - self.overhead_bytes

    def record(self) -> dict | None:
        """What a manifest's plan records (None for an image placed without a budget: all on the device)."""
        if self.budget is None:
            return None
        return {
            "inputs": self.budget.inputs(),
            "kv_bytes": self.kv_bytes,
            "overhead_bytes": self.overhead_bytes,
            "cold_layers": list(self.cold_layers),
            "ranks": [dict(r) for r in self.ranks],
        }


def tier_bytes(plan: RankPlan, tiers: Mapping[str, str]) -> dict[str, int]:
    """A rank's bytes by tier."""
    out = dict.fromkeys(TIERS, 0)
    for seg in plan.segments:
        out[tiers.get(seg.name, TIER_DEVICE)] += seg.nbytes
    return out


def spread(layers: Sequence[int], count: int) -> list[int]:
    """`count` of `layers` spread evenly (the middle of each of `count` equal runs), in order."""
    n = len(layers)
    return [layers[(2 * i + 1) * n // (2 * count)] for i in range(count)]


def place(plans: Sequence[RankPlan], rules: PlacementRules, config: Any, budget: Budget | None) -> Placement:
    """The tiers of every rank's segments for `budget` (all on the device without one); PlacementError if none fit."""
    if budget is None:
        return Placement(None, {}, 0, 0, (), tuple(tier_bytes(p, {}) for p in plans))
    world = len(plans)
    gpu = int(budget.gpu_gib * GIB)
    kv = rules.kv_bytes(config, budget.max_seqs, budget.max_context)
    overhead = int(budget.overhead_gib * GIB)
    reserve = kv + overhead
    hot = [0] * world
    experts: list[dict[int, list[SegmentPlan]]] = [{} for _ in plans]
    engram: dict[str, list[int]] = {}  # name -> bytes on every rank, in plan order
    for r, plan in enumerate(plans):
        for seg in plan.segments:
            role = rules.movable(seg)
            if role is None:
                hot[r] += seg.nbytes
            elif role.role == EXPERTS:
                experts[r].setdefault(role.layer, []).append(seg)
            else:
                engram.setdefault(seg.name, [0] * world)[r] = seg.nbytes
    worst = max(range(world), key=lambda r: hot[r])
    if hot[worst] + reserve > gpu:
        raise PlacementError(_unfit_device(budget, world, worst, hot[worst], kv, overhead))
    size = [{layer: sum(s.nbytes for s in segs) for layer, segs in e.items()} for e in experts]
    cold, used = _fewest_cold(hot, size, gpu - reserve)
    tiers = {seg.name: "host" for layer in cold for seg in experts[0].get(layer, ())}
    host_left = None if budget.host_gib is None else int(budget.host_gib * GIB)
    cold_bytes = sum(size[r].get(layer, 0) for r in range(world) for layer in cold)
    if host_left is not None:
        if cold_bytes > host_left:
            raise PlacementError(
                f"the routed experts of {len(cold)} layer(s) ({_gib(cold_bytes)} over {world} rank(s)) must leave "
                f"the {budget.gpu_gib:g} GiB GPUs but only {budget.host_gib:g} GiB of host memory was given; "
                f"give more host memory (--host-memory-gib){_more_gpus(world)}"
            )
        host_left -= cold_bytes
    for name, nbytes in engram.items():
        # rows read a few times a token leave the device before any expert table does
        if not cold and all(used[r] + nbytes[r] + reserve <= gpu for r in range(world)):
            used = [used[r] + nbytes[r] for r in range(world)]
        elif host_left is None or sum(nbytes) <= host_left:
            tiers[name] = "host"
            host_left = None if host_left is None else host_left - sum(nbytes)
        elif budget.nvme_dir is not None:
            tiers[name] = "nvme"
        else:
            raise PlacementError(
                f"{name} ({_gib(sum(nbytes))} over {world} rank(s)) fits neither the {budget.gpu_gib:g} GiB GPUs "
                f"nor the {_gib(host_left)} left of the {budget.host_gib:g} GiB of host memory; give --nvme DIR, "
                f"more host memory (--host-memory-gib){_more_gpus(world)}"
            )
    ranks = tuple(tier_bytes(p, tiers) for p in plans)
    return Placement(budget, tiers, kv, overhead, tuple(cold), ranks)


def _fewest_cold(hot: list[int], size: list[dict[int, int]], room: int) -> tuple[list[int], list[int]]:
    """The fewest layers whose expert tables, spread evenly, must leave the device for every rank's rest to fit
    in `room`, and each rank's device bytes then (every layer cold always fits: the hot part was checked)."""
    layers = sorted(set().union(*size))
    for count in range(len(layers) + 1):
        cold = spread(layers, count) if count else []
        used = [
            h + sum(b for layer, b in s.items() if layer not in cold) for h, s in zip(hot, size, strict=True)
        ]
        if all(u <= room for u in used):
            break
    return cold, used


def _gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.1f} GiB"


def _more_gpus(world: int) -> str:
    return f" or more GPUs (--tp {2 * world})" if world < 8 else ""


def _unfit_device(budget: Budget, world: int, rank: int, hot: int, kv: int, overhead: int) -> str:
    """The one line saying the device tier alone does not fit, and what to change."""
    need = hot + kv + overhead
    fixes = [f"more GPUs (--tp {2 * world})"] if world < 8 else []
    if kv >= GIB // 4:
        fixes.append("a lower --max-context or --max-seqs")
    fixes.append("a smaller --overhead-gib")
    return (
        f"rank {rank} needs {_gib(need)} of GPU memory even with every routed expert and Engram row off the device "
        f"({_gib(hot)} that every step reads + {_gib(kv)} of KV for {budget.max_seqs} sequences of "
        f"{budget.max_context:,} tokens + {_gib(overhead)} overhead), over the {budget.gpu_gib:g} GiB GPU; use "
        + _either(fixes)
    )


def _either(choices: list[str]) -> str:
    """'a', 'a or b', 'a, b, or c'."""
    if len(choices) < 3:
        return " or ".join(choices)
    return ", ".join(choices[:-1]) + ", or " + choices[-1]
