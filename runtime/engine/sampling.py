"""Token sampling keyed by seed and position: greedy, or temperature with top-k, min-p and top-p.

A sampled token depends only on the logits, the parameters, the seed and the token's absolute position
in its sequence, never on what else ran in the step or how often the sampler was called: one uniform
draw u = H(seed, position) in [0, 1) picks the token by inverse CDF over the kept tokens, sorted by
logit (stable, lower id first among equals). Filters apply in the order vLLM documents: temperature,
top-k, then softmax, min-p (keep p >= min_p * p_max), top-p (shortest prefix whose mass reaches top_p).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from tfc.errors import TfcError

MASK64 = (1 << 64) - 1
MAX_SEED = (1 << 63) - 1


class SamplingError(TfcError):
    """Sampling options that make no sense."""


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy; top_k 0 = off; top_p 1 = off; min_p 0 = off; seed None = a fresh random seed."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0

    def __post_init__(self) -> None:
        if not 0 <= self.temperature < float("inf"):
            raise SamplingError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingError(f"top-p must lie in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise SamplingError(f"top-k must be >= 0, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise SamplingError(f"min-p must lie in [0, 1], got {self.min_p}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise SamplingError(f"seed must lie in [0, 2**63 - 1], got {self.seed}")


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of a 64-bit value."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """The draw in [0, 1) for a token at `position` of a sequence sampled with `seed` (53 random bits)."""
    return (_mix(_mix(seed & MASK64) ^ (position & MASK64)) >> 11) * 2.0**-53


def sample(logits: torch.Tensor, params: SamplingParams, seed: int, position: int) -> int:
    """The token at `position` from logits [V] (any device; the same token on every device).

    The argmax and the stable sort run where the logits are: a stable sort's order is unique (lower id first
    among equals), so the GPU's is the CPU's, and a host sort of the whole vocabulary costs more than a decode
    step. The arithmetic after the sort runs on the CPU in fp64, on the same values in the same order.
    """
    logits = logits.detach().reshape(-1).to(torch.float64)
    if params.temperature == 0:
        return int(torch.argmax(logits))  # first index among equal maxima
    order = torch.sort(logits, descending=True, stable=True).indices
    ranked = logits[order].cpu() / params.temperature
    order = order.cpu()
    if params.top_k:
        ranked = ranked[: params.top_k]
    probs = torch.softmax(ranked, dim=0)
    if params.min_p > 0:
        probs = probs[: max(1, int((probs >= params.min_p * probs[0]).sum()))]
    if params.top_p < 1:
        before = torch.cumsum(probs, 0) - probs
        probs = probs[: max(1, int((before < params.top_p * probs.sum()).sum()))]
    cdf = torch.cumsum(probs, 0)
    pick = int(torch.searchsorted(cdf, uniform(seed, position) * float(cdf[-1]), right=True))
    return int(order[min(pick, probs.numel() - 1)])


class Sampler:
    """One sequence's sampler: its params and seed (a fresh random one when the params give none)."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.seed = params.seed if params.seed is not None else secrets.randbits(63)
        self._next = 0

    def sample(self, logits: torch.Tensor, position: int | None = None) -> int:
        """The token at `position` (default: one past the last position this sampler drew for)."""
        if position is None:
            position = self._next
        self._next = position + 1
        return sample(logits, self.params, self.seed, position)
