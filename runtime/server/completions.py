"""The two generation routes: OpenAI bodies -> engine requests -> one JSON reply or an SSE stream."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from tfc.runtime.engine.generate import token_sha
from tfc.runtime.engine.request import Event, PromptError, Rejected, Request, next_id
from tfc.runtime.engine.sampling import MAX_SEED, SamplingParams, _mix
from tfc.runtime.server import sse
from tfc.runtime.server.errors import error_body, error_response
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


def _prompts(state: ServerState, body: Any, chat: bool) -> list[tuple[int, ...]]:
    """The prompt ids of every prompt in the body."""
    if chat:
        return [tuple(state.chat.render([m.model_dump(exclude_none=True) for m in body.messages]))]
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


def _requests(state: ServerState, body: Sampling, prompts: list[tuple[int, ...]]) -> list[Request]:
    """One engine request per (prompt, choice)."""
    info = state.engine.info
    context = min(state.engine.config.max_context, info.context)
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    stop_ids = set(body.stop_token_ids or [])
    if not body.ignore_eos:
        stop_ids |= set(info.eos_ids)
    top_k = body.top_k if body.top_k and body.top_k > 0 else 0
    out = []
    for prompt in prompts:
        limit = body.max_completion_tokens or body.max_tokens or max(1, context - len(prompt))
        for j in range(body.n):
            params = SamplingParams(
                temperature=1.0 if body.temperature is None else body.temperature,
                top_p=1.0 if body.top_p is None else body.top_p,
                top_k=top_k, min_p=body.min_p or 0.0, seed=choice_seed(body.seed, j),
            )  # fmt: skip
            out.append(Request(prompt, params, limit, frozenset(stop_ids), tuple(stops)))
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
        try:
            prompts = _prompts(state, body, chat)
            requests = _requests(state, body, prompts)
            streams = state.engine.submit(requests)
        except BadRequest as bad:
            return error_response(bad.message, bad.status, bad.code, bad.param)
        except PromptError as bad:
            return error_response(str(bad), 400, "invalid_prompt", bad.param)
        except Rejected as no:
            return error_response(no.message, no.status, no.code, no.param, no.retry_after)
        state.metrics.requests.inc()
        kind = "chat.completion" if chat else "text_completion"
        rid = next_id("chatcmpl" if chat else "cmpl")
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            handed_off = True
            return StreamingResponse(
                _stream(state, streams, prompts, body.n, chat, kind, rid, include_usage),
                media_type="text/event-stream", headers=sse.HEADERS,
            )  # fmt: skip
        return await _collect(state, streams, prompts, body.n, chat, kind, rid)
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


def _usage(prompts: list[tuple[int, ...]], completion: int) -> dict:
    prompt = sum(len(p) for p in prompts)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": 0}}  # fmt: skip


async def _collect(state, streams, prompts, n, chat, kind, rid) -> JSONResponse:
    """Wait for every choice; one chat.completion / text_completion object."""
    try:
        finals = await asyncio.gather(*[_drain(s) for s in streams])
    except asyncio.CancelledError:
        for s in streams:
            s.cancel()
        raise
    choices = []
    for i, (text, last) in enumerate(finals):
        if last.finish == "error":
            state.metrics.errors.inc()
            return error_response(last.error or "generation failed", 503 if state.status == "draining" else 500,
                                  "server_error")  # fmt: skip
        choice: dict[str, Any] = {
            "index": i,
            "finish_reason": last.finish,
            "token_sha": token_sha(last.tokens),
        }
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice.update(text=text, logprobs=None)
        choices.append(choice)
    completion = sum(last.usage.completion_tokens for _, last in finals)
    reply = {"id": rid, "object": kind, "created": int(time.time()), "model": state.model_name,
             "choices": choices, "usage": _usage(prompts, completion)}  # fmt: skip
    if len(choices) == 1:
        reply["token_sha"] = choices[0]["token_sha"]
    return JSONResponse(reply)


async def _drain(stream) -> tuple[str, Event]:
    parts = []
    async for event in stream:
        parts.append(event.text)
        if event.finish is not None:
            return "".join(parts), event
    raise RuntimeError("stream ended without a final event")


async def _stream(state, streams, prompts, n, chat, kind, rid, include_usage) -> AsyncIterator[bytes]:
    """SSE frames of every choice as they come; keepalives until the first token; usage; [DONE]."""
    merged: asyncio.Queue = asyncio.Queue()
    pumps = [asyncio.create_task(_pump(i, s, merged)) for i, s in enumerate(streams)]
    created = int(time.time())
    chunk_kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(i: int, delta: dict | None, text: str | None, finish: str | None, **extra) -> bytes:
        choice: dict[str, Any] = {"index": i, "finish_reason": finish}
        if chat:
            choice["delta"] = delta or {}
        else:
            choice.update(text=text or "", logprobs=None)
        return sse.frame({"id": rid, "object": chunk_kind, "created": created, "model": state.model_name,
                          "choices": [{**choice, **extra}]})  # fmt: skip

    try:
        if chat:
            for i in range(len(streams)):
                yield chunk(i, {"role": "assistant", "content": ""}, None, None)
        open_, completion, seen_token = len(streams), 0, False
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
            if event.text and event.finish is None:
                yield chunk(i, {"content": event.text}, event.text, None)
            if event.finish is not None:
                open_ -= 1
                completion += event.usage.completion_tokens
                if event.text:
                    yield chunk(i, {"content": event.text}, event.text, None)
                yield chunk(i, {}, "", event.finish, token_sha=token_sha(event.tokens))
        if include_usage:
            yield sse.frame({"id": rid, "object": chunk_kind, "created": created, "model": state.model_name,
                             "choices": [], "usage": _usage(prompts, completion)})  # fmt: skip
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
