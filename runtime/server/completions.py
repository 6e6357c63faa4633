"""The two generation routes: OpenAI bodies -> engine requests -> one JSON reply or an SSE stream."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from tfc.runtime.engine.generate import token_sha
from tfc.runtime.engine.request import Event
from tfc.runtime.server import chat as chats
from tfc.runtime.server import sse
from tfc.runtime.server.admission import InFlight, Job, Refusal, admit, drain, not_ready, wrong_model
from tfc.runtime.server.errors import error_body, error_response, refused
from tfc.runtime.server.logprob_view import chat_entries, completion_logprobs, echoed_logprobs
from tfc.runtime.server.protocol import ChatCompletionRequest, CompletionRequest
from tfc.runtime.server.state import ServerState


async def generation(state: ServerState, body: ChatCompletionRequest | CompletionRequest, chat: bool):
    """Serve one generation body: admission first, then a JSON reply or an SSE stream."""
    with InFlight(state) as flight:
        if state.status != "ready":
            return refused(not_ready(state))
        wrong = wrong_model(state, body.model)
        if wrong is not None:
            return refused(wrong)
        try:
            job, streams = await admit(state, body, chat)
        except Refusal as no:
            return refused(no)
        state.metrics.requests.inc()
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            flight.hand_off()
            return StreamingResponse(
                _stream(state, streams, job, include_usage),
                media_type="text/event-stream",
                headers=sse.HEADERS,
            )
        return await _collect(state, streams, job)


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


async def _collect(state: ServerState, streams, job: Job) -> JSONResponse:
    """Wait for every choice; one chat.completion / text_completion object."""
    try:
        finals = await asyncio.gather(*[drain(s) for s in streams])
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


async def _stream(state: ServerState, streams, job: Job, include_usage: bool) -> AsyncIterator[bytes]:
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
