"""Batched generation over a model runner or worker: chunked prefill, then one token a step per sequence.

Where the runner drafts (and `draft` is on), a step feeds each sequence its last token and a draft, samples
every row as the serial loop samples that position and keeps the drafts that match: the same tokens, in
fewer steps (runtime/engine/drafting.py).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from tfc.runtime.engine.draft_backoff import DraftBackoff, DraftGate
from tfc.runtime.engine.drafting import DRAFT_ROWS, DraftCounts, chooser, draft_length, share
from tfc.runtime.engine.sampling import Sampler, SamplingError, SamplingParams
from tfc.runtime.worker.runner import DraftAsk, ModelRunner, drafter_of
from tfc.runtime.worker.step import SequenceStep, StepPlan


@dataclass
class Generation:
    """One sequence's generated tokens, why it stopped, and (when kept) the logits of each step."""

    tokens: list[int] = field(default_factory=list)
    finish: str = "length"  # "length" or "stop"
    logits: list[torch.Tensor] = field(default_factory=list)
    prefill_s: float = 0.0  # start to the first token (the whole batch's prefill)
    decode_s: float = 0.0  # first token to last token
    drafted: DraftCounts = field(default_factory=DraftCounts)  # draft-verify rounds and their tokens

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
    draft: bool = True,
    draft_rows: int = DRAFT_ROWS,
) -> list[Generation]:
    """Generate up to `max_new_tokens` per prompt, all prompts in one batch; `on_token(i, token)` streams.

    Prompt i runs in slot i. `prefill_chunk` > 0 prefills in chunks of that many tokens (0 = whole prompts
    in one step). `draft`: draft and verify where the runner can (the tokens are the same), each sequence within its
    share of `draft_rows` rows a step (drafting.share). Slots are released when generation ends.
    """
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if len(prompts) > runner.capacity.slots:
        raise ValueError(f"{len(prompts)} prompts for {runner.capacity.slots} slots")
    plist = list(params) if isinstance(params, Sequence) else [params] * len(prompts)
    if any(p.penalizes for p in plist):
        raise SamplingError("penalties and logit bias are the engine's (tfc serve); generate samples without")
    samplers = [Sampler(p) for p in plist]
    drafts = drafter_of(runner) if draft else None
    out = [Generation() for _ in prompts]
    backoff = [DraftBackoff() for _ in prompts]
    gate = DraftGate()
    position = [0] * len(prompts)
    last: list[torch.Tensor | None] = [None] * len(prompts)
    started = time.perf_counter()
    first: list[float | None] = [None] * len(prompts)

    def step(rows: list[SequenceStep]) -> tuple[torch.Tensor, ...]:
        return runner.execute(StepPlan(tuple(rows))).logits

    def emit(i: int, logits: torch.Tensor, token: int) -> bool:
        """Record sequence i's next token; whether it goes on."""
        if keep_logits:
            out[i].logits.append(logits)
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
            return False
        return len(out[i].tokens) < max_new_tokens

    def verify(i: int, rows: torch.Tensor, tokens: tuple[int, ...]) -> bool:
        """Emit the drafts serial sampling agrees with, roll back the rest; whether sequence i goes on."""
        p, going, kept = position[i], True, 0
        while kept < len(tokens) - 1 and going:
            token = samplers[i].sample(rows[kept], p + kept + 1)
            if token != tokens[kept + 1]:
                break
            going = emit(i, rows[kept], token)
            kept += 1
        drafts.rollback(i, p + kept + 1)
        backoff[i].after(kept)
        gate.after(kept)
        out[i].drafted.add(len(tokens) - 1, kept)
        position[i], last[i] = p + kept + 1, rows[kept]  # the next sample from rows[kept] is the bonus
        return going

    try:
        size = prefill_chunk or max(len(p) for p in prompts)
        for lo in range(0, max(len(p) for p in prompts), size):
            todo = [i for i, p in enumerate(prompts) if lo < len(p)]
            chunks = [tuple(prompts[i][lo : lo + size]) for i in todo]
            rows = [
                SequenceStep(i, c, position[i], drafting=drafts is not None, prompt=True)
                for i, c in zip(todo, chunks, strict=True)
            ]
            for i, c, logits in zip(todo, chunks, step(rows), strict=True):
                position[i] += len(c)
                last[i] = logits
        live = list(range(len(prompts)))
        while live:
            rows = []
            block = (
                min(drafts.draft_block, share(len(live), draft_rows))
                if drafts is not None and gate.open()
                else 0
            )
            asks = []
            for i in live:
                token = samplers[i].sample(last[i], position[i])
                if emit(i, last[i], token):
                    rows.append(SequenceStep(i, (token,), position[i], False, drafts is not None))
                    if block and backoff[i].ready():
                        k = draft_length(len(out[i].tokens), position[i], max_new_tokens,
                                         runner.capacity.tokens_per_slot, block)  # fmt: skip
                        if k > 0:
                            asks.append((len(rows) - 1, DraftAsk(i, token, k)))
            if asks:  # every drafting sequence in one draft
                choose = chooser(
                    [(samplers[a.slot].params, samplers[a.slot].seed, position[a.slot] + 1) for _, a in asks]
                )
                for (r, _), tail in zip(asks, drafts.draft([a for _, a in asks], choose), strict=True):
                    if tail:
                        rows[r] = replace(rows[r], tokens=(*rows[r].tokens, *tail), verify=True)
            if not rows:
                break
            live = []
            for row, logits in zip(rows, step(rows), strict=True):
                if row.verify:
                    going = verify(row.slot, logits, row.tokens)
                else:
                    position[row.slot] += 1
                    last[row.slot], going = logits, True
                if going:
                    live.append(row.slot)
    finally:
        for i in range(len(prompts)):
            runner.release(i)
    return out
