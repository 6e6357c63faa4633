"""Batched generation with the DeepSeek-V4.1 reference forward: chunked prefill, then one token a step."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tfc.runtime.dsv41_engram import EngramFeed
from tfc.runtime.dsv41_model import Dsv41Model
from tfc.runtime.dsv41_state import SequenceState
from tfc.runtime.sampling import Sampler, SamplingParams


@dataclass
class Generation:
    """One sequence's generated tokens, why it stopped, and (when kept) the logits of each step."""

    tokens: list[int] = field(default_factory=list)
    finish: str = "length"  # "length" or "stop"
    logits: list[torch.Tensor] = field(default_factory=list)


def step(
    model: Dsv41Model,
    chunks: Sequence[Sequence[int]],
    states: Sequence[SequenceState],
    feed: EngramFeed | None,
) -> list[torch.Tensor]:
    """Run each sequence's next chunk; returns the last-position logits [V] of each."""
    rows = None
    if feed is not None:
        rows = [feed.rows(s.tokens, c) for s, c in zip(states, chunks, strict=True)]
    return [out[0] for out in model.forward(chunks, states, rows, last_only=True)]


def generate(
    model: Dsv41Model,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
    *,
    feed: EngramFeed | None = None,
    stop_ids: Sequence[int] = (),
    prefill_chunk: int = 0,
    keep_logits: bool = False,
    on_token: Callable[[int, int], None] | None = None,
) -> list[Generation]:
    """Generate up to `max_new_tokens` per prompt, all prompts in one batch; `on_token(i, token)` streams.

    `prefill_chunk` > 0 prefills in chunks of that many tokens (0 = whole prompts in one call).
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
    samplers = [Sampler(p) for p in plist]
    states = [model.new_state() for _ in prompts]
    out = [Generation() for _ in prompts]
    size = prefill_chunk or max(len(p) for p in prompts)
    last: list[torch.Tensor | None] = [None] * len(prompts)
    for lo in range(0, max(len(p) for p in prompts), size):
        todo = [i for i, p in enumerate(prompts) if lo < len(p)]
        logits = step(model, [prompts[i][lo : lo + size] for i in todo], [states[i] for i in todo], feed)
        for i, lg in zip(todo, logits, strict=True):
            last[i] = lg
    live = list(range(len(prompts)))
    for _ in range(max_new_tokens):
        nxt = []
        for i in live:
            if keep_logits:
                out[i].logits.append(last[i])
            token = samplers[i].sample(last[i])
            out[i].tokens.append(token)
            if on_token is not None:
                on_token(i, token)
            if token in stop_ids:
                out[i].finish = "stop"
            elif len(out[i].tokens) < max_new_tokens:
                nxt.append(i)
        live = nxt
        if not live:
            break
        logits = step(model, [[out[i].tokens[-1]] for i in live], [states[i] for i in live], feed)
        for i, lg in zip(live, logits, strict=True):
            last[i] = lg
    return out
