"""The two generation routes: OpenAI bodies -> engine requests -> one JSON reply or an SSE stream."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from tfc.runtime.engine.generate import token_sha
from tfc.runtime.engine.request import Event, PromptError, Rejected, Request, next_id
from tfc.runtime.engine.sampling import MAX_SEED, SamplingParams, _mix
from tfc.runtime.server import chat as chats
from tfc.runtime.server import sse
from tfc.runtime.server.errors import error_body, error_response
from tfc.runtime.server.logprob_view import TokenNames, chat_entries, completion_logprobs, echoed_logprobs
from tfc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest, Sampling
from tfc.runtime.server.state import ServerState


class BadRequest(Exception):
    """A body that parses but cannot be served (a 400 naming the field)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.message, self.param, self.status, self.code = message, param, status, code


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


def _stops(body: Sampling) -> list[str]:
    return [body.stop] if isinstance(body.stop, str) else list(body.stop or [])


@dataclass
class _Job:
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


def _prompts(state: ServerState, body: Any) -> list[tuple[int, ...]]:
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


def _job(state: ServerState, body: Any, chat: bool) -> _Job:
    """Render the body's prompts (a chat body through the chat format's plan)."""
    if chat:
        plan = state.chat.plan(chats.messages(body), chats.options(body, tuple(_stops(body))))
        job = _Job(True, [plan.prompt], body.n, next_id("chatcmpl"), plan, body.logprobs)
    else:
        job = _Job(False, _prompts(state, body), body.n, next_id("cmpl"), logprobs=body.logprobs is not None)
        if body.echo:  # each prompt's ids as text, special ones included, so text_offset indexes the text
            job.echo = [state.tokenizer.decode(list(ids), skip_special_tokens=False) for ids in job.prompts]
    if job.logprobs:
        job.names = TokenNames(state.tokenizer)
    job.max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    if job.max_tokens == 0 and not getattr(body, "echo", False):
        raise BadRequest(
            "max_tokens 0 generates nothing: it needs a completions echo (the prompt scored)", "max_tokens"
        )
    return job


def _prepare(state: ServerState, body: Any, chat: bool) -> tuple[_Job, list[Request]]:
    job = _job(state, body, chat)
    return job, _requests(state, body, job)


def _requests(state: ServerState, body: Sampling, job: _Job) -> list[Request]:
    """One engine request per (prompt, choice)."""
    info = state.engine.info
    context = min(state.engine.config.max_context, info.context)
    stops = _stops(body)
    stop_ids = set(body.stop_token_ids or [])
    if not body.ignore_eos:
        stop_ids |= set(info.eos_ids)
    top_k = body.top_k if body.top_k and body.top_k > 0 else 0
    bias = _logit_bias(body, info.vocab_size)
    if job.plan is not None:  # chat: the reply reader cuts stop strings, a constraint may hold the reply
        stops, reader, logprobs = [], job.plan.reader, (body.top_logprobs or 0) if body.logprobs else None
        constraints = chats.constraints(state, job.plan, body.n)
    else:
        reader, logprobs, constraints = None, body.logprobs, [None] * body.n
    # an echo's logprobs cover its prompt too
    prompt_logprobs = body.logprobs if getattr(body, "echo", False) else None
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
            out.append(Request(prompt, params, limit, frozenset(stop_ids), tuple(stops),
                               constraint=constraints[j], logprobs=logprobs, reader=reader, draft=body.draft,
                               prompt_logprobs=prompt_logprobs, min_tokens=body.min_tokens))  # fmt: skip
    return out


async def generation(state: ServerState, body: ChatCompletionRequest | CompletionRequest, chat: bool):
    """Serve one generation body: admission first, then a JSON reply or an SSE stream."""
    state.inflight += 1
    handed_off = False
    try:
        if state.after_count is not None:
            state.after_count()
        if state.status != "ready":
            return _not_ready(state)
        if body.model is not None and body.model != state.model_name:
            return error_response(
                f"The model `{body.model}` does not exist.", 404, "model_not_found", "model"
            )
        try:  # rendering and grammar compiling run off the event loop (a first grammar builds its token trie)
            job, requests = await asyncio.to_thread(_prepare, state, body, chat)
            streams = state.engine.submit(requests)
        except BadRequest as bad:
            return error_response(bad.message, bad.status, bad.code, bad.param)
        except PromptError as bad:
            return error_response(str(bad), 400, "invalid_prompt", bad.param)
        except chats.ConstraintError as bad:
            return error_response(bad.message, 400, "invalid_grammar", bad.param)
        except Rejected as no:
            return error_response(no.message, no.status, no.code, no.param, no.retry_after)
        state.metrics.requests.inc()
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            handed_off = True
            return StreamingResponse(
                _stream(state, streams, job, include_usage),
                media_type="text/event-stream",
                headers=sse.HEADERS,
            )
        return await _collect(state, streams, job)
    finally:
        if not handed_off:
            state.inflight -= 1


def _not_ready(state: ServerState) -> JSONResponse:
    if state.status == "draining":
        return error_response(
            "server restarting: retry shortly", 503, "server_restarting", retry_after=30, close=True
        )
    if state.status == "failed":
        return error_response(f"the server failed: {state.failure}", 503, "engine_dead")
    return error_response("the model is still booting: retry shortly", 503, "booting", retry_after=5)


DRAFT_COUNTS = ("drafts", "draft_tokens", "accepted_tokens")


def _usage(
    prompts: list[tuple[int, ...]], completion: int, reasoning: int | None = None, cached: Sequence[int] = (),
    drafted: Sequence[Any] = (),
) -> dict:  # fmt: skip
    """The usage object; `cached` holds each choice's prompt tokens restored from the prefix cache, `drafted`
    each choice's engine Usage (its draft-verify counts go in `tfc_draft`, a field OpenAI clients ignore)."""
    prompt = sum(len(p) for p in prompts)
    n = max(1, len(cached) // max(1, len(prompts)))  # choices per prompt, in prompt order
    # a prompt counts once in prompt_tokens, so once here too: as the most any of its choices restored
    hit = sum(max(cached[i : i + n]) for i in range(0, len(cached), n))
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
             "prompt_tokens_details": {"cached_tokens": hit}}  # fmt: skip
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    usage["tfc_draft"] = {k: sum(getattr(u, k) for u in drafted) for k in DRAFT_COUNTS}
    return usage


async def _collect(state, streams, job: _Job) -> JSONResponse:
    """Wait for every choice; one chat.completion / text_completion object."""
    try:
        finals = await asyncio.gather(*[_drain(s) for s in streams])
    except asyncio.CancelledError:
        for s in streams:
            s.cancel()
        raise
    choices, reasoning = [], 0
    for i, (pieces, logprobs, last, _) in enumerate(finals):
        if last.finish == "error":
            state.metrics.errors.inc()
            return error_response(last.error or "generation failed", 503 if state.status == "draining" else 500,
                                  "server_error")  # fmt: skip
        choice: dict[str, Any] = {
            "index": i,
            "finish_reason": last.finish,
            "token_sha": token_sha(last.tokens),
        }
        if job.chat:
            reply = chats.Reply()
            reply.add(pieces)
            choice.update(finish_reason=reply.finish_reason(last.finish), message=reply.message(),
                          logprobs={"content": chat_entries(job.names, logprobs)} if job.logprobs else None)  # fmt: skip
            if reply.cut_in_reasoning(last.finish):
                choice["finish_detail"] = chats.warn_cut(
                    job.rid, job.max_tokens or last.usage.completion_tokens
                )
            reasoning += reply.reasoning_tokens
        else:
            lp = completion_logprobs(job.names, logprobs) if job.logprobs else None
            if job.echo is not None and job.logprobs:
                first = finals[i][3]
                lp = echoed_logprobs(job.names, job.prompts[i // job.n][0], first.prompt_logprobs, logprobs)
            choice.update(text=job.echoed(i) + "".join(pieces), logprobs=lp)
        choices.append(choice)
    completion = sum(last.usage.completion_tokens for _, _, last, _ in finals)
    cached = [last.usage.cached_tokens for _, _, last, _ in finals]
    drafted = [last.usage for _, _, last, _ in finals]
    usage = _usage(job.prompts, completion, reasoning if job.chat else None, cached, drafted)
    reply = {"id": job.rid, "object": job.kind, "created": int(time.time()), "model": state.model_name,
             "choices": choices, "usage": usage}  # fmt: skip
    if len(choices) == 1:
        reply["token_sha"] = choices[0]["token_sha"]
    return JSONResponse(reply)


async def _drain(stream) -> tuple[list, tuple, Event, Event]:
    """(the pieces of every event: strings or reply parts, every token's logprobs, the last event, the first)."""
    pieces, logprobs, first = [], [], None
    async for event in stream:
        first = first or event
        if isinstance(event.text, list):
            pieces.extend(event.text)
        elif event.text:
            pieces.append(event.text)
        logprobs.extend(event.logprobs)
        if event.finish is not None:
            return pieces, tuple(logprobs), event, first
    raise RuntimeError("stream ended without a final event")


async def _stream(state, streams, job: _Job, include_usage) -> AsyncIterator[bytes]:
    """SSE frames of every choice as they come; keepalives until the first token; usage; [DONE]."""
    merged: asyncio.Queue = asyncio.Queue()
    pumps = [asyncio.create_task(_pump(i, s, merged)) for i, s in enumerate(streams)]
    created = int(time.time())
    chunk_kind = "chat.completion.chunk" if job.chat else "text_completion"
    replies = [chats.Reply() for _ in streams]
    offsets = [0] * len(streams)
    echoed = [False] * len(streams)

    def chunk(i: int, delta: dict | None, text: str | None, finish: str | None, **extra) -> bytes:
        choice: dict[str, Any] = {"index": i, "finish_reason": finish}
        if job.chat:
            choice["delta"] = delta or {}
        else:
            choice.update(text=text or "", logprobs=None)
        return sse.frame({"id": job.rid, "object": chunk_kind, "created": created, "model": state.model_name,
                          "choices": [{**choice, **extra}]})  # fmt: skip

    def pieces(i: int, event: Event) -> list[bytes]:
        """The frames one event's new text (or reply parts) and logprobs make."""
        extra = {}
        if job.chat:
            if job.logprobs and event.logprobs:
                extra["logprobs"] = {"content": chat_entries(job.names, event.logprobs)}
            deltas = replies[i].add(event.text if isinstance(event.text, list) else [])
            if not deltas and extra:
                deltas = [{}]
            return [chunk(i, d, None, None, **(extra if k == 0 else {})) for k, d in enumerate(deltas)]
        text = event.text
        if job.echo is not None and not echoed[i]:  # the prompt, before the choice's first piece
            echoed[i], text = True, job.echoed(i) + text
            if job.logprobs:
                first = job.prompts[i // job.n][0]
                extra["logprobs"] = echoed_logprobs(job.names, first, event.prompt_logprobs, event.logprobs)
        elif job.logprobs and event.logprobs:
            extra["logprobs"] = completion_logprobs(job.names, event.logprobs, offsets[i])
        offsets[i] += len(text)
        return [chunk(i, None, text, None, **extra)] if text or extra else []

    try:
        if job.chat:
            for i in range(len(streams)):
                yield chunk(i, {"role": "assistant", "content": ""}, None, None)
        open_, completion, reasoning, seen_token = len(streams), 0, 0, False
        cached, drafted = [0] * len(streams), []
        while open_:
            if not seen_token and state.keepalive_s:
                try:
                    i, event = await asyncio.wait_for(merged.get(), state.keepalive_s)
                except TimeoutError:
                    yield sse.KEEPALIVE
                    continue
            else:
                i, event = await merged.get()
            seen_token = True
            if event.finish == "error":
                state.metrics.errors.inc()
                yield sse.frame(error_body(event.error or "generation failed", 500, "server_error"))
                yield sse.DONE
                return
            for frame in pieces(i, event):
                yield frame
            if event.finish is not None:
                open_ -= 1
                completion += event.usage.completion_tokens
                cached[i] = event.usage.cached_tokens
                drafted.append(event.usage)
                finish, extra = event.finish, {}
                if job.chat:
                    finish = replies[i].finish_reason(event.finish)
                    reasoning += replies[i].reasoning_tokens
                    if replies[i].cut_in_reasoning(event.finish):
                        extra["finish_detail"] = chats.warn_cut(
                            job.rid, job.max_tokens or event.usage.completion_tokens
                        )
                yield chunk(i, {}, "", finish, token_sha=token_sha(event.tokens), **extra)
        if include_usage:
            usage = _usage(job.prompts, completion, reasoning if job.chat else None, cached, drafted)
            yield sse.frame({"id": job.rid, "object": chunk_kind, "created": created, "model": state.model_name,
                             "choices": [], "usage": usage})  # fmt: skip
        yield sse.DONE
    finally:
        for s in streams:
            s.cancel()
        for p in pumps:
            p.cancel()
        state.inflight -= 1


async def _pump(index: int, stream, merged: asyncio.Queue) -> None:
    async for event in stream:
        await merged.put((index, event))
