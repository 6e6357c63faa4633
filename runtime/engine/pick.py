"""A step's tokens: every unconstrained position drawn in one batched call, then each row's pick (its constraint
mask applied before the sampler, its logprobs when asked)."""

from __future__ import annotations

from typing import Any

import torch
from tfc.runtime.engine.constraint import masked
from tfc.runtime.engine.engine_seq import EngineSeq
from tfc.runtime.engine.logprobs import rows_logprobs, token_logprob
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import penalized, sample, sample_rows
from tfc.runtime.engine.scheduler import Running


def step_draws(plan: Any, logits: Any, seqs: dict[int, EngineSeq]) -> dict[tuple[int, int], int]:
    """The token of every position this step may sample without a constraint, drawn in one batched call (the
    same tokens as one at a time): {(slot, position): token}. `seqs` {slot: sequence}, as before the step."""
    keys, rows = [], []
    for row, out in zip(plan.rows, logits, strict=True):
        seq = seqs[row.slot]
        r, fed = seq.request, seq.run.fed
        if r.constraint is not None:  # its mask follows its own tokens: drawn in turn
            continue
        if row.verify:  # every position of the window (the walk may stop before the last)
            for i in range(len(row.tokens)):
                keys.append((row.slot, row.position + i + 1, r))
                rows.append(_adjusted(out[i], r, seq.run, row, i))
        elif fed + len(row.tokens) >= len(seq.run.prompt):
            keys.append((row.slot, fed + len(row.tokens), r))
            rows.append(_adjusted(out, r, seq.run, row, len(row.tokens) - 1))
    if not keys:
        return {}
    tokens = sample_rows(torch.stack([x.reshape(-1).to(torch.float64) for x in rows]), [r.params for _, _, r in keys],
                         [seed_of(r) for _, _, r in keys], [at for _, at, _ in keys])  # fmt: skip
    return {(slot, at): token for (slot, at, _), token in zip(keys, tokens, strict=True)}


def _adjusted(logits: Any, r: Request, run: Running, row: Any, i: int) -> Any:
    """A row's logits for the token after its row's i-th token, with the request's bias and penalties, its stop
    ids masked before min_tokens."""
    if r.params.penalizes:
        before = run.ids_before(row.position) + tuple(row.tokens[: i + 1])
        logits = penalized(logits, r.params, before, len(run.prompt))
    return held_open(logits, r, row.position + i + 1, len(run.prompt))


def held_open(logits: Any, r: Request, position: int, prompt_len: int) -> Any:
    """Logits [V] with the request's stop ids at -inf while the token at `position` comes before min_tokens
    generated ones (vLLM masks them the same way); unchanged when that would leave no token to draw."""
    if position - prompt_len >= r.min_tokens or not r.stop_ids:
        return logits
    ids = [t for t in r.stop_ids if 0 <= t < logits.numel()]
    out = logits.reshape(-1).to(torch.float64).clone()
    out[ids] = float("-inf")
    return out if bool(torch.isfinite(out).any()) else logits


def pick(r: Request, logits: Any, position: int, drawn: int | None = None,
         run: Running | None = None) -> tuple[int, tuple]:  # fmt: skip
    """The token at `position` (`drawn`: step_draws' token, for an unconstrained request) and, when asked, its
    logprobs (the model's, before any bias or penalty); `run` holds the ids before `position` (penalties)."""
    if drawn is not None and r.logprobs is None:
        return drawn, ()
    logits = logits.detach().reshape(-1).to(torch.float64)  # where the step left them: sample draws there
    if r.constraint is not None:
        logits = masked(logits, r.constraint.allowed())
    if drawn is None and (r.params.penalizes or r.min_tokens):
        if run is None:
            raise ValueError("a request with penalties or min_tokens needs its run to pick")
        adjusted = penalized(logits, r.params, run.ids_before(position), len(run.prompt))
        token = sample(held_open(adjusted, r, position, len(run.prompt)), r.params, seed_of(r), position)
    else:
        token = drawn if drawn is not None else sample(logits, r.params, seed_of(r), position)
    if r.constraint is not None:
        r.constraint.advance(token)
    if r.logprobs is None:
        return token, ()
    return token, (token_logprob(logits.cpu(), token, r.logprobs),)


def seed_of(r: Request) -> int:
    """The seed a request samples with (admission gives an unseeded request one of its own)."""
    return r.params.seed or 0


def prompt_logprobs(plan: Any, logits: tuple, seqs: dict[int, EngineSeq]) -> list:
    """Each `every` row's prompt logprobs kept in its sequence; the rows' last logits, as every other row's."""
    out = list(logits)
    for i, row in enumerate(plan.rows):
        if not row.every:
            continue
        seq = seqs[row.slot]
        prompt, k = seq.run.prompt, seq.request.prompt_logprobs or 0
        n = min(len(row.tokens), len(prompt) - row.position - 1)  # rows whose next id is a prompt id
        if n > 0:
            targets = list(prompt[row.position + 1 : row.position + 1 + n])
            seq.prompt_logprobs += rows_logprobs(out[i][:n], targets, k)
        out[i] = out[i][-1]
    return out
