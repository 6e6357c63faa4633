"""A base for the tests' stand-in slot drafters: the batched `propose` over a `propose_one` per slot."""

from __future__ import annotations


class OneAtATime:
    """Proposes for every ask in turn through `propose_one(slot, tokens, last_token, k)`; counts the calls."""

    calls = 0  # batched proposals, each for every drafting slot of a step

    def propose(self, asks, choose) -> list[tuple[int, ...]]:
        self.calls += 1
        return [self.propose_one(*ask) for ask in asks]
