"""A world of ranks as threads of one process: collectives over a barrier, for fast TP tests without processes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch


class ThreadWorld:
    """Shared state of `world` thread ranks; `comm(rank)` gives each rank its collectives."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world)
        self.slots: list[Any] = [None] * world

    def comm(self, rank: int) -> ThreadComm:
        return ThreadComm(self, rank)

    def run(self, fn: Callable[[int, ThreadComm], Any]) -> list[Any]:
        """fn(rank, comm) on every rank at once; the results in rank order (the first error re-raised)."""
        out: list[Any] = [None] * self.world
        errors: list[BaseException] = []

        def body(rank: int) -> None:
            try:
                out[rank] = fn(rank, self.comm(rank))
            except BaseException as error:
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=body, args=(r,)) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        if errors:
            raise errors[0]
        return out


class ThreadComm:
    """One thread rank's collectives: every rank posts its tensor, waits, reads everyone's."""

    def __init__(self, shared: ThreadWorld, rank: int) -> None:
        self.shared, self.rank, self.world = shared, rank, shared.world

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        self.shared.barrier.wait()
        self.shared.slots[self.rank] = t.clone()
        self.shared.barrier.wait()
        out = [s.clone() for s in self.shared.slots]
        self.shared.barrier.wait()
        return out

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        parts = self.all_gather(t)
        t.copy_(torch.stack(parts).sum(0))
        return t
