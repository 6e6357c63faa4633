"""Token sampling: greedy, or temperature with top-k and top-p, from a per-sequence seeded generator."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from tfc.errors import TfcError


class SamplingError(TfcError):
    """Sampling options that make no sense."""


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1 = off; seed None = a fresh random seed."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise SamplingError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingError(f"top-p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SamplingError(f"top-k must be >= 0, got {self.top_k}")


class Sampler:
    """Samples one sequence's tokens; the same params and seed give the same tokens for the same logits."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        seed = params.seed if params.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def sample(self, logits: torch.Tensor) -> int:
        """Next token from logits [V] (any device; sampling runs on the CPU in fp64)."""
        logits = logits.detach().reshape(-1).to("cpu", torch.float64)
        p = self.params
        if p.temperature == 0:
            return int(torch.argmax(logits))  # first index among equal maxima
        order = torch.sort(logits, descending=True, stable=True).indices
        ranked = logits[order] / p.temperature
        if p.top_k:
            ranked = ranked[: p.top_k]
        probs = torch.softmax(ranked, dim=0)
        if p.top_p < 1:
            # Keep the shortest prefix whose mass reaches top_p (at least one token).
            before = torch.cumsum(probs, 0) - probs
            probs = probs[: max(1, int((before < p.top_p).sum()))]
            probs = probs / probs.sum()
        pick = torch.multinomial(probs, 1, generator=self.generator)
        return int(order[pick])
