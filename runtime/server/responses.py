"""`POST /v1/responses`: a Responses body run as its chat completion; a response object or its events.

Stateless: nothing is stored, so `previous_response_id` is refused and `store` changes nothing. Admission,
rendering, grammars and sampling are the chat route's (admission.py); only the request's translation
(responses_input.py) and the reply's shape (responses_output.py) are this API's own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from fastapi.responses import JSONResponse, StreamingResponse
from tfc.runtime.engine.generate import token_sha
from tfc.runtime.server import sse
from tfc.runtime.server.admission import InFlight, Refusal, admit, drain, not_ready, wrong_model
from tfc.runtime.server.errors import error_response, refused
from tfc.runtime.server.responses_input import Translation, translate
from tfc.runtime.server.responses_output import OutputBuilder, item_id, response_object, usage
from tfc.runtime.server.responses_protocol import ResponsesRequest, refusals
from tfc.runtime.server.state import ServerState


def _status(finish: str) -> tuple[str, dict | None]:
    """The response status and incomplete_details of an engine finish ("length": the token budget ran out)."""
    if finish == "length":
        return "incomplete", {"reason": "max_output_tokens"}
    return "completed", None


async def create_response(state: ServerState, body: ResponsesRequest):
    """Serve one Responses body: admission first, then a response object or an SSE stream of events."""
    with InFlight(state) as flight:
        if state.status != "ready":
            return refused(not_ready(state))
        wrong = wrong_model(state, body.model)
        if wrong is not None:
            return refused(wrong)
        unsupported = refusals(body)
        if unsupported is not None:
            return error_response(unsupported[0], 400, "unsupported_parameter", unsupported[1])
        t = Translation()
        try:
            t = translate(body)
            job, (stream,) = await admit(state, t.chat, True)
        except Refusal as no:
            param, message = t.rename(no.param, no.message)
            return error_response(message, no.status, no.code, param, no.retry_after)
        state.metrics.requests.inc()
        rid, created = item_id("resp"), int(time.time())
        prompt = len(job.prompts[0])
        if body.stream:
            flight.hand_off()
            events = _events(state, stream, body, rid, created, prompt)
            return StreamingResponse(events, media_type="text/event-stream", headers=sse.HEADERS)
        return await _whole(state, stream, body, rid, created, prompt)


async def _whole(state: ServerState, stream, body: ResponsesRequest, rid: str, created: int, prompt: int):
    """Wait for the reply; one response object."""
    parts, _, last, _ = await drain(stream)
    if last.finish == "error":
        state.metrics.errors.inc()
        return error_response(
            last.error or "generation failed", 503 if state.status == "draining" else 500, "server_error"
        )
    out = OutputBuilder()
    out.add(parts)
    status, details = _status(last.finish)
    out.finish(status == "completed")
    reply = response_object(
        body,
        rid,
        created,
        state.model_name,
        status,
        out.items,
        incomplete_details=details,
        token_sha=token_sha(last.tokens),
        usage=usage(prompt, last.usage.completion_tokens, out.reasoning_tokens, last.usage.cached_tokens),
    )
    return JSONResponse(reply)


async def _events(
    state: ServerState, stream, body: ResponsesRequest, rid: str, created: int, prompt: int
) -> AsyncIterator[bytes]:
    """The response's events as they come, each numbered; keepalives until the first token."""
    queue: asyncio.Queue = asyncio.Queue()
    pump = asyncio.create_task(_pump(stream, queue))
    out, seq = OutputBuilder(), 0

    def frames(events: list[dict]) -> bytes:
        nonlocal seq
        chunks = []
        for event in events:
            chunks.append(sse.event(event["type"], {**event, "sequence_number": seq}))
            seq += 1
        return b"".join(chunks)

    try:
        start = response_object(body, rid, created, state.model_name, "in_progress")
        yield frames(
            [
                {"type": "response.created", "response": start},
                {"type": "response.in_progress", "response": start},
            ]
        )
        seen_token = False
        while True:
            if not seen_token and state.keepalive_s:
                try:
                    event = await asyncio.wait_for(queue.get(), state.keepalive_s)
                except TimeoutError:
                    yield sse.KEEPALIVE
                    continue
            else:
                event = await queue.get()
            seen_token = True
            if event.finish == "error":
                state.metrics.errors.inc()
                message = event.error or "generation failed"
                out.finish(False)  # the items so far, closed as incomplete, go in the failed response
                failed = response_object(
                    body,
                    rid,
                    created,
                    state.model_name,
                    "failed",
                    out.items,
                    error={"code": "server_error", "message": message},
                )
                yield frames(
                    [
                        {"type": "error", "code": "server_error", "message": message, "param": None},
                        {"type": "response.failed", "response": failed},
                    ]
                )
                return
            chunk = frames(out.add(event.text if isinstance(event.text, list) else []))
            if chunk:
                yield chunk
            if event.finish is not None:
                status, details = _status(event.finish)
                chunk = frames(out.finish(status == "completed"))
                final = response_object(
                    body,
                    rid,
                    created,
                    state.model_name,
                    status,
                    out.items,
                    incomplete_details=details,
                    token_sha=token_sha(event.tokens),
                    usage=usage(
                        prompt, event.usage.completion_tokens, out.reasoning_tokens, event.usage.cached_tokens
                    ),
                )
                yield chunk + frames([{"type": f"response.{status}", "response": final}])
                return
    finally:
        stream.cancel()
        pump.cancel()
        state.inflight -= 1


async def _pump(stream, queue: asyncio.Queue) -> None:
    async for event in stream:
        await queue.put(event)


async def not_kept(response_id: str) -> JSONResponse:
    """GET / DELETE of a stored response: none is ever stored here."""
    return error_response(
        f"No response with id {response_id!r}: this server does not store responses",
        404,
        "not_found",
        "response_id",
    )
