"""The collectives a rank's forward calls: a sum of fixed-point words and an all-gather, timed per call."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch


class Collectives(Protocol):
    """What a model needs of its rank world: the world's size and rank, a SUM all-reduce, an all-gather."""

    world: int
    rank: int

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Every rank's `t` summed (integer words: exact in any order), in place; returns `t`."""
        ...

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `t` (same shape and dtype on every rank), in rank order."""
        ...


@dataclass
class CommStats:
    """Calls, seconds and bytes spent in collectives (seconds include waiting for slower ranks)."""

    calls: int = 0
    seconds: float = 0.0
    bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "seconds": round(self.seconds, 6), "bytes": self.bytes}


class Solo:
    """The collectives of a world of one: nothing to exchange."""

    world, rank = 1, 0

    def __init__(self) -> None:
        self.stats = CommStats()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        return [t]


SOLO = Solo()


@dataclass
class TorchCollectives:
    """torch.distributed collectives over one process group (gloo on the CPU, NCCL on CUDA)."""

    world: int
    rank: int
    group: Any = None  # None: the default group
    stats: CommStats = field(default_factory=CommStats)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        start = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
        self._count(start, t.numel() * t.element_size())
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        import torch.distributed as dist

        start = time.perf_counter()
        raw = t.contiguous().view(
            torch.uint8
        )  # bytes: a copy every backend moves for any dtype (gloo has no int16)
        out = [torch.empty_like(raw) for _ in range(self.world)]
        dist.all_gather(out, raw, group=self.group)
        self._count(start, raw.numel() * self.world)
        return [o.view(t.dtype) for o in out]

    def _count(self, start: float, nbytes: int) -> None:
        self.stats.calls += 1
        self.stats.seconds += time.perf_counter() - start
        self.stats.bytes += nbytes
