"""Token sampling keyed by seed and position: greedy, or temperature with top-k, min-p and top-p; before either,
a request's logit bias and repetition, frequency and presence penalties (`penalized`).

A sampled token depends only on the logits, the parameters, the seed and the token's absolute position
in its sequence, never on what else ran in the step or how often the sampler was called: one uniform
draw u = H(seed, position) in [0, 1) picks the token by inverse CDF over the kept tokens, in id order, or
sorted by logit (stable, lower id first among equals) when top-k or top-p needs the ranking. Filters apply in
the order vLLM documents: temperature, top-k, then softmax, min-p (keep p >= min_p * p_max), top-p (shortest
prefix whose mass reaches top_p).

The weights are fixed point: w = floor(exp((l - l_max) / T) * 2**WEIGHT_BITS) as int64, so every sum after
them is exact and the same in any order. The whole draw runs where the logits are, one sync for the result: a
GPU's sort, prefix sums and search give the CPU's token unless the two exp() differ in a weight's last unit
and the draw lands on that unit (odds of about 2**-40 a draw). A token whose weight rounds to 0 (below 2**-44
of the top token's probability) is never drawn.
"""

from __future__ import annotations

import math
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
    """temperature 0 = greedy; top_k 0 = off; top_p 1 = off; min_p 0 = off; seed None = a fresh random seed;
    penalties 0 (repetition 1) = off; logit_bias: (token id, bias) pairs added to the logits."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()

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
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise SamplingError(
                    f"{name.replace('_', ' ')} must lie in [-2, 2], got {getattr(self, name)}"
                )
        if not 0 < self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise SamplingError(
                f"repetition penalty must lie in (0, {MAX_REPETITION_PENALTY}], got {self.repetition_penalty}"
            )
        for token, bias in self.logit_bias:
            if token < 0 or not -100 <= bias <= 100:
                raise SamplingError(
                    f"logit bias needs token ids >= 0 and biases in [-100, 100], got {token}: {bias}"
                )

    @property
    def penalizes(self) -> bool:
        """Whether the logits change before the draw (a bias or a penalty is set)."""
        return (
            bool(self.logit_bias)
            or bool(self.presence_penalty or self.frequency_penalty)
            or (self.repetition_penalty != 1)
        )


MAX_REPETITION_PENALTY = 10.0


def penalized(logits: torch.Tensor, params: SamplingParams, before: tuple[int, ...] | list[int],
              prompt_len: int) -> torch.Tensor:  # fmt: skip
    """fp64 logits [V] of the token after `before` (the sequence's ids so far, its first prompt_len the prompt),
    in vLLM's order: the logit bias added; the repetition penalty on every id seen in prompt or output (a
    positive logit divided by it, a negative one multiplied); then, over the output only, frequency x count +
    presence x (count > 0) subtracted. Every operation is per token, so a row's result is its own."""
    out = logits.detach().reshape(-1).to(torch.float64)
    if not params.penalizes:
        return out
    out, dev, vocab = out.clone(), out.device, out.shape[0]
    if params.logit_bias:
        if max(t for t, _ in params.logit_bias) >= vocab:
            raise SamplingError(f"logit bias names a token id past the vocabulary of {vocab}")
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.int64, device=dev)
        out.index_add_(
            0, ids, torch.tensor([b for _, b in params.logit_bias], dtype=torch.float64, device=dev)
        )
    seen = torch.tensor(list(before), dtype=torch.int64, device=dev)
    if params.repetition_penalty != 1 and seen.numel():
        at = torch.unique(seen)
        x = out[at]
        out[at] = torch.where(x > 0, x / params.repetition_penalty, x * params.repetition_penalty)
    if (params.frequency_penalty or params.presence_penalty) and seen.numel() > prompt_len:
        counts = torch.bincount(seen[prompt_len:], minlength=vocab).to(torch.float64)
        out -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(torch.float64)
    return out


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit hash of a 64-bit value."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def uniform(seed: int, position: int) -> float:
    """The draw in [0, 1) for a token at `position` of a sequence sampled with `seed` (53 random bits)."""
    return (_mix(_mix(seed & MASK64) ^ (position & MASK64)) >> 11) * 2.0**-53


WEIGHT_BITS = 44  # below 2**19 weights of at most 2**44 each: their sum fits an int64
# Logits this far (times T) under the top one have weight 0 for sure: the CPU sorts only the rest.
CUT = WEIGHT_BITS * math.log(2) + 1


def sample(logits: torch.Tensor, params: SamplingParams, seed: int, position: int) -> int:
    """The token at `position` from logits [V] (any device; the same token on every device)."""
    return sample_rows(logits.reshape(1, -1), [params], [seed], [position])[0]


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int],
                positions: list[int]) -> list[int]:  # fmt: skip
    """sample() of every row of logits [R, V]: on a GPU in a few batched launches, the same tokens as one row at
    a time (every operation is per row, and exact after the weights); on the CPU row by row."""
    return sample_rows_on(logits, params, seeds, positions).tolist()


def sample_rows_on(logits: torch.Tensor, params: list[SamplingParams], seeds: list[int],
                   positions: list[int]) -> torch.Tensor:  # fmt: skip
    """sample_rows' tokens as an int64 tensor [R] on the logits' device: on a GPU nothing waits for them, so a
    caller can feed them to the next launch (the drafter's Markov walk) before the host reads them."""
    logits = logits.detach().to(torch.float64)
    greedy = [i for i, p in enumerate(params) if p.temperature == 0]
    if len(greedy) == len(params):  # the first index among equal maxima
        return torch.argmax(logits, dim=1)
    out = torch.zeros(len(params), dtype=torch.long, device=logits.device)
    if greedy:
        out[greedy] = torch.argmax(logits[greedy], dim=1)
    plain = [i for i, p in enumerate(params) if p.temperature > 0 and not _ranks(p)]
    ranked = [i for i, p in enumerate(params) if p.temperature > 0 and _ranks(p)]
    for group in (plain, ranked):
        if not group:
            continue
        us = [uniform(seeds[i], positions[i]) for i in group]
        # on the CPU row by row: a ranking sorts only logits near the top; [R, V] temporaries page-fault
        if logits.device.type == "cpu":
            tokens = torch.tensor(
                [draw(logits[i], params[i], u, cut=True) for i, u in zip(group, us, strict=True)]
            )
        else:
            tokens = draw_rows(logits[group], [params[i] for i in group], us)
        out[group] = tokens
    return out


def _ranks(params: SamplingParams) -> bool:
    """Whether the filters need the ranking (top-k, top-p): the kept tokens are walked by logit."""
    return bool(params.top_k) or params.top_p < 1


def draw(logits: torch.Tensor, params: SamplingParams, u: float, cut: bool = False) -> int:
    """The token of draw u in [0, 1) from fp64 logits [V] at params.temperature > 0; `cut`: a ranking sorts only
    the logits within CUT * T of the top (what a CPU's sort of the whole vocabulary would spend on weights of 0)."""
    ids = None
    if cut and _ranks(params):
        ids = torch.nonzero(logits >= logits.max() - CUT * params.temperature).reshape(1, -1)
        logits = logits[ids[0]]
    return int(draw_rows(logits.reshape(1, -1), [params], [u], ids)[0])


def draw_rows(logits: torch.Tensor, params: list[SamplingParams], us: list[float],
              ids: torch.Tensor | None = None) -> torch.Tensor:  # fmt: skip
    """The tokens [R] (int64, on the logits' device) of draws us from fp64 logits [R, V] (temperature > 0, all rows
    ranking or none); `ids` [R, V]: the token id of each column (default: the column)."""
    n = logits.shape[1]
    spec = torch.tensor(
        [[p.temperature, p.top_k or n, math.ceil(p.min_p * 2.0**WEIGHT_BITS), p.top_p, u]
         for p, u in zip(params, us, strict=True)],
        dtype=torch.float64,
    ).to(logits.device)  # fmt: skip
    t, top_k, min_w, top_p, u = (spec[:, j : j + 1] for j in range(5))  # integers below 2**53: exact
    top = logits.max(dim=1, keepdim=True).values
    if _ranks(params[0]):
        logits, order = torch.sort(logits, dim=1, descending=True, stable=True)
        ids = order if ids is None else ids.gather(1, order)
    w = torch.floor(torch.exp((logits - top) / t) * 2.0**WEIGHT_BITS).to(torch.int64)
    if any(p.top_k or p.min_p > 0 for p in params):
        # top-k, then min-p (p >= min_p * p_max, in weights: the top token's is 2**WEIGHT_BITS)
        keep = (torch.arange(n, device=w.device) < top_k.to(torch.int64)) & (w >= min_w.to(torch.int64))
        w = torch.where(keep, w, 0)
    cdf = torch.cumsum(w, 1)
    if any(p.top_p < 1 for p in params):  # top-p: the shortest prefix whose mass reaches it
        reach = torch.ceil(cdf[:, -1:].to(torch.float64) * top_p)
        w = torch.where((top_p < 1) & (cdf - w >= reach), 0, w)
        cdf = torch.cumsum(w, 1)
    total = cdf[:, -1:]
    target = torch.minimum(torch.floor(total.to(torch.float64) * u).to(torch.int64), total - 1)
    at = torch.searchsorted(cdf, target, right=True)
    return (at if ids is None else ids.gather(1, at)).reshape(-1)


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
