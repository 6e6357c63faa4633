"""Batched generation over a model runner or worker: chunked prefill, then one token a step per sequence."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from tfc.runtime.engine.sampling import Sampler, SamplingParams
from tfc.runtime.worker.step import ModelRunner, SequenceStep, StepPlan


@dataclass
class Generation:
    """One sequence's generated tokens, why it stopped, and (when kept) the logits of each step."""

    tokens: list[int] = field(default_factory=list)
    finish: str = "length"  # "length" or "stop"
    logits: list[torch.Tensor] = field(default_factory=list)
    prefill_s: float = 0.0  # start to the first token (the whole batch's prefill)
    decode_s: float = 0.0  # first token to last token

    @property
    def decode_tok_s(self) -> float:
        """Decode rate after the first token: (tokens - 1) / (last token - first token), as peers report it."""
        return (len(self.tokens) - 1) / self.decode_s if len(self.tokens) > 1 and self.decode_s > 0 else 0.0

    @property
    def token_sha(self) -> str:
        """SHA-256 over the generated ids (little-endian int32 each): equal digests, equal tokens."""
        return token_sha(self.tokens)


def token_sha(tokens: Sequence[int]) -> str:
    """SHA-256 hex digest of token ids as little-endian int32."""
    return hashlib.sha256(b"".join(int(t).to_bytes(4, "little", signed=True) for t in tokens)).hexdigest()


def generate(
    runner: ModelRunner,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
    *,
    stop_ids: Sequence[int] = (),
    prefill_chunk: int = 0,
    keep_logits: bool = False,
    on_token: Callable[[int, int], None] | None = None,
) -> list[Generation]:
    """Generate up to `max_new_tokens` per prompt, all prompts in one batch; `on_token(i, token)` streams.

    Prompt i runs in slot i. `prefill_chunk` > 0 prefills in chunks of that many tokens (0 = whole prompts
    in one step). Slots are released when generation ends.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if len(prompts) > runner.capacity.slots:
        raise ValueError(f"{len(prompts)} prompts for {runner.capacity.slots} slots")
    plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
    samplers = [Sampler(p) for p in plist]
    out = [Generation() for _ in prompts]
    position = [0] * len(prompts)
    last: list[torch.Tensor | None] = [None] * len(prompts)

    def run(todo: list[int], chunks: list[Sequence[int]]) -> None:
        plan = StepPlan(
            tuple(SequenceStep(i, tuple(c), position[i]) for i, c in zip(todo, chunks, strict=True))
        )
        for i, c, logits in zip(todo, chunks, runner.execute(plan).logits, strict=True):
            position[i] += len(c)
            last[i] = logits

    started = time.perf_counter()
    first: list[float | None] = [None] * len(prompts)
    try:
        size = prefill_chunk or max(len(p) for p in prompts)
        for lo in range(0, max(len(p) for p in prompts), size):
            todo = [i for i, p in enumerate(prompts) if lo < len(p)]
            run(todo, [prompts[i][lo : lo + size] for i in todo])
        live = list(range(len(prompts)))
        for _ in range(max_new_tokens):
            nxt = []
            for i in live:
                if keep_logits:
                    out[i].logits.append(last[i])
                token = samplers[i].sample(last[i], position[i])
                now = time.perf_counter()
                if first[i] is None:
                    first[i] = now
                    out[i].prefill_s = now - started
                out[i].decode_s = now - first[i]
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
            run(live, [[out[i].tokens[-1]] for i in live])
    finally:
        for i in range(len(prompts)):
            runner.release(i)
    return out
