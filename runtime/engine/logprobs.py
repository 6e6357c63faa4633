"""Log-probabilities of a picked token and the most likely alternatives, from the logits the sampler saw.

They are the log-softmax of the step's logits after any constraint mask and before temperature or the
top-k / min-p / top-p filters (the model's distribution over the ids the request allowed), in fp64.
Alternatives are ordered by logprob, lower id first among equals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MAX_TOP = 20


@dataclass(frozen=True)
class TokenLogprob:
    """One generated token's logprob and the `top` most likely ids at its position as (id, logprob)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprob(logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
    """The logprob of `token` under logits [V] (fp64 on the CPU), with the `top` best alternatives."""
    return rows_logprobs(logits.reshape(1, -1), [token], top)[0]


def rows_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """token_logprob of tokens[j] under logits[j] for every row of logits [n, V] (where they are, one copy down)."""
    lp = torch.log_softmax(logits.to(torch.float64), dim=1)
    at = torch.tensor(tokens, dtype=torch.int64, device=lp.device).reshape(-1, 1)
    chosen = lp.gather(1, at).reshape(-1).tolist()
    tops: list[tuple[tuple[int, float], ...]] = [()] * len(tokens)
    if top > 0:
        values, ids = torch.topk(lp, min(top, lp.shape[1]), dim=1)
        for j, (i_row, v_row) in enumerate(zip(ids.tolist(), values.tolist(), strict=True)):
            pairs = sorted(zip(i_row, v_row, strict=True), key=lambda p: (-p[1], p[0]))
            tops[j] = tuple((i, _finite(v)) for i, v in pairs)
    return [TokenLogprob(t, _finite(v), b) for t, v, b in zip(tokens, chosen, tops, strict=True)]


def _finite(value: float) -> float:
    """JSON has no -inf: a forbidden id's logprob is reported as -9999.0, as peers do."""
    return value if math.isfinite(value) else -9999.0
