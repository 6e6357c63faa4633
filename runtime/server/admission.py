"""What every generation route shares: a body rendered into engine requests and submitted, or one `Refusal`
that each route puts in its API's error shape; and a stream drained into its pieces.

The chat completions, completions, Messages and Responses routes all come here: the last two translate their
body into the chat completion it means first. A route counts the request (`InFlight`) before it reads the
server's status (the drain's race rule), then asks `not_ready` and `admit`.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tfc.runtime.engine.engine_seq import Stream
from tfc.runtime.engine.request import Event, PromptError, Rejected, Request, next_id
from tfc.runtime.engine.sampling import MAX_SEED, SamplingParams, _mix
from tfc.runtime.server import chat as chats
from tfc.runtime.server.logprob_view import TokenNames
from tfc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, Sampling
from tfc.runtime.server.state import ServerState


class InFlight:
    """One generation request counted in `state.inflight` from its arrival until its reply is done; a stream
    that takes the reply over (`hand_off`) gives the count back when it ends."""

    def __init__(self, state: ServerState) -> None:
        self.state, self.handed_off = state, False

    def __enter__(self) -> InFlight:
        self.state.inflight += 1
        if self.state.after_count is not None:
            self.state.after_count()
        return self

    def hand_off(self) -> None:
        """The reply's stream now holds the count."""
        self.handed_off = True

    def __exit__(self, *exc: object) -> None:
        if not self.handed_off:
            self.state.inflight -= 1


class Refusal(Exception):
    """A request refused before its reply's first byte: a status, a code, the field it names, when to retry,
    and whether to close the connection (a draining server)."""

    def __init__(
        self, message: str, status: int, code: str | None = None, param: str | None = None,
        retry_after: int | None = None, close: bool = False,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.message, self.status, self.code, self.param = message, status, code, param
        self.retry_after, self.close = retry_after, close


class BadRequest(Refusal):
    """A body that parses but cannot be served (a 400 naming the field, unless another status is given)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message, status, code, param)


def field_path(parts: Sequence[str | int]) -> str:
    """A field's path as every route names it in a refusal: `messages[0].content` (an index in brackets)."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts).removeprefix(".")


def not_ready(state: ServerState) -> Refusal:
    """Why a server that is not ready refuses work: draining (hang up), failed, or still booting."""
    if state.status == "draining":
        return Refusal(
            "server restarting: retry shortly", 503, "server_restarting", retry_after=30, close=True
        )
    if state.status == "failed":
        return Refusal(f"the server failed: {state.failure}", 503, "engine_dead")
    return Refusal("the model is still booting: retry shortly", 503, "booting", retry_after=5)


def wrong_model(state: ServerState, model: str | None) -> Refusal | None:
    """The refusal of a body that names another model than the one served (None: it names this one, or none)."""
    if model is None or model == state.model_name:
        return None
    return Refusal(f"The model `{model}` does not exist.", 404, "model_not_found", "model")


async def admit(
    state: ServerState, body: ChatCompletionRequest | CompletionRequest, chat: bool
) -> tuple[Job, list[Stream]]:
    """Render a body and submit its requests: the job and its streams, or a Refusal (rendering and grammar
    compiling run off the event loop: a first grammar builds its token trie)."""
    try:
        job, requests = await asyncio.to_thread(prepare, state, body, chat)
        return job, state.engine.submit(requests)
    except PromptError as bad:
        raise Refusal(str(bad), 400, "invalid_prompt", bad.param) from None
    except chats.ConstraintError as bad:
        raise Refusal(bad.message, 400, "invalid_grammar", bad.param) from None
    except Rejected as no:
        raise Refusal(no.message, no.status, no.code, no.param, no.retry_after) from None


def choice_seed(seed: int | None, index: int) -> int:
    """Choice 0 samples with the request's seed, choice i > 0 with a seed derived from it; none given: random."""
    if seed is None:
        return secrets.randbits(63)
    return seed if index == 0 else _mix(seed ^ index) & MAX_SEED


def _logit_bias(body: Sampling, vocab: int) -> tuple[tuple[int, float], ...]:
    """logit_bias as (token id, bias) pairs in id order (a 400 naming the field for a key that is no id)."""
    out = []
    for key, bias in (body.logit_bias or {}).items():
        if not key.isdigit() or int(key) >= vocab:
            raise BadRequest(f"logit_bias keys must be token ids in [0, {vocab}), got {key!r}", "logit_bias")
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


def stops(body: Sampling) -> list[str]:
    """The body's stop strings."""
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


@dataclass
class Job:
    """One generation body as it runs: its prompts, the chat plan (chat), what the reply needs to say."""

    chat: bool
    prompts: list[tuple[int, ...]]
    n: int
    rid: str
    plan: Any = None
    logprobs: bool = False
    names: Any = None
    max_tokens: int | None = None
    echo: list[str] | None = None  # completions with echo: each prompt's text, put before its replies

    def echoed(self, choice: int) -> str:
        """The text an echoing choice starts with ('' without echo)."""
        return "" if self.echo is None else self.echo[choice // self.n]

    @property
    def kind(self) -> str:
        return "chat.completion" if self.chat else "text_completion"


def _prompts(state: ServerState, body: CompletionRequest) -> list[tuple[int, ...]]:
    """The prompt ids of every prompt in a completions body."""
    p = body.prompt
    if isinstance(p, str):
        return [tuple(state.chat.encode(p, chat=False))]
    if not p:
        raise BadRequest("the prompt is empty", "prompt")
    if isinstance(p[0], int):
        return [tuple(p)]
    if isinstance(p[0], str):
        return [tuple(state.chat.encode(s, chat=False)) for s in p]
    return [tuple(x) for x in p]


def _job(state: ServerState, body: Any, chat: bool) -> Job:
    """Render the body's prompts (a chat body through the chat format's plan)."""
    if chat:
        plan = state.chat.plan(chats.messages(body), chats.options(body, tuple(stops(body))))
        job = Job(True, [plan.prompt], body.n, next_id("chatcmpl"), plan, body.logprobs)
    else:
        job = Job(False, _prompts(state, body), body.n, next_id("cmpl"), logprobs=body.logprobs is not None)
        if body.echo:  # each prompt's ids as text, special ones included, so text_offset indexes the text
            job.echo = [state.tokenizer.decode(list(ids), skip_special_tokens=False) for ids in job.prompts]
    if job.logprobs:
        job.names = TokenNames(state.tokenizer)
    job.max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if job.max_tokens == 0 and job.echo is None:
        raise BadRequest(
            "max_tokens 0 generates nothing: it needs a completions echo (the prompt scored)", "max_tokens"
        )
    return job


def prepare(
    state: ServerState, body: ChatCompletionRequest | CompletionRequest, chat: bool
) -> tuple[Job, list[Request]]:
    """A body's job and its engine requests, one per (prompt, choice); a BadRequest naming the field."""
    job = _job(state, body, chat)
    return job, _requests(state, body, job)


def _requests(state: ServerState, body: Any, job: Job) -> list[Request]:
    """One engine request per (prompt, choice)."""
    info = state.engine.info
    context = min(state.engine.config.max_context, info.context)
    stop_strings = stops(body)
    stop_ids = set(body.stop_token_ids or [])
    if not body.ignore_eos:
        stop_ids |= set(info.eos_ids)
    top_k = body.top_k if body.top_k and body.top_k > 0 else 0
    bias = _logit_bias(body, info.vocab_size)
    if job.plan is not None:  # chat: the reply reader cuts stop strings, a constraint may hold the reply
        stop_strings, reader = [], job.plan.reader
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        constraints = chats.constraints(state, job.plan, body.n)
    else:
        reader, logprobs, constraints = None, body.logprobs, [None] * body.n
    # an echo's logprobs cover its prompt too
    prompt_logprobs = body.logprobs if job.echo is not None else None
    out = []
    for prompt in job.prompts:
        limit = job.max_tokens if job.max_tokens is not None else max(1, context - len(prompt))
        for j in range(body.n):
            params = SamplingParams(
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                top_k=top_k, min_p=body.min_p or 0.0, seed=choice_seed(body.seed, j),
                presence_penalty=body.presence_penalty or 0.0, frequency_penalty=body.frequency_penalty or 0.0,
                repetition_penalty=body.repetition_penalty or 1.0, logit_bias=bias,
            )  # fmt: skip
            out.append(Request(prompt, params, limit, frozenset(stop_ids), tuple(stop_strings),
                               constraint=constraints[j], logprobs=logprobs, reader=reader, draft=body.draft,
                               prompt_logprobs=prompt_logprobs, min_tokens=body.min_tokens))  # fmt: skip
    return out


async def drain(stream: Stream) -> tuple[list, tuple, Event, Event]:
    """(the pieces of every event: strings or reply parts, every token's logprobs, the last event, the first);
    a cancelled wait cancels the stream."""
    pieces, logprobs, first = [], [], None
    try:
        async for event in stream:
            first = first or event
            if isinstance(event.text, list):
                pieces.extend(event.text)
            elif event.text:
                pieces.append(event.text)
            logprobs.extend(event.logprobs)
            if event.finish is not None:
                return pieces, tuple(logprobs), event, first
    except asyncio.CancelledError:
        stream.cancel()
        raise
    raise RuntimeError("stream ended without a final event")
