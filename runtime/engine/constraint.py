"""Per-request token constraints for the sampling step: which ids the next token may be, advanced by each pick.

The engine asks a constraint to `start` computing the next mask before it runs the model step (a grammar
computes it on another thread while the forward runs), then applies `allowed()` to the logits before the
sampler and the logprobs see them, then tells it the token picked (`advance`). A constraint knows nothing
of chat formats: a grammar, or a fixed set of banned ids, is all it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


class TokenConstraint(Protocol):
    """What the sampling step needs of a constraint."""

    def start(self) -> None:
        """Begin computing the mask of the next token (may return before it is ready)."""

    def allowed(self) -> torch.Tensor | None:
        """A bool [V] of the ids the next token may be (waits for `start`), or None for any id."""

    def advance(self, token: int) -> None:
        """The token that was picked."""


@dataclass(frozen=True)
class BannedTokens:
    """A constraint that never lets a few ids be picked (e.g. a markup token the request turned off)."""

    vocab_size: int
    banned: frozenset[int]

    def start(self) -> None:
        pass

    def allowed(self) -> torch.Tensor | None:
        mask = torch.ones(self.vocab_size, dtype=torch.bool)
        mask[[t for t in self.banned if 0 <= t < self.vocab_size]] = False
        return mask

    def advance(self, token: int) -> None:
        pass


class AllOf:
    """Several constraints at once: a token must pass every one."""

    def __init__(self, parts: Iterable[TokenConstraint]) -> None:
        self.parts = tuple(parts)

    def start(self) -> None:
        for p in self.parts:
            p.start()

    def allowed(self) -> torch.Tensor | None:
        mask = None
        for p in self.parts:
            m = p.allowed()
            if m is not None:
                mask = m if mask is None else mask & m
        return mask

    def advance(self, token: int) -> None:
        for p in self.parts:
            p.advance(token)


def masked(logits: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """Logits [V] (any device) with every id the mask forbids set to -inf (ids past the mask too); unchanged
    when None."""
    if allowed is None:
        return logits
    if allowed.numel() != logits.numel():
        keep = torch.zeros(logits.numel(), dtype=torch.bool)
        n = min(logits.numel(), allowed.numel())
        keep[:n] = allowed[:n]
        allowed = keep
    allowed = allowed.to(logits.device)
    if not bool(allowed.any()):  # a constraint that allows nothing cannot steer: leave the model be
        return logits
    return logits.masked_fill(~allowed, float("-inf"))
