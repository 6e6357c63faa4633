"""Anthropic's Messages API: POST /v1/messages (JSON or SSE) and /v1/messages/count_tokens.

A body is checked here, translated into the chat completion it means (`messages_request`), prepared and
submitted on the chat route's path, and its reply parts built into content blocks (`messages_reply`).
Refusals come in Anthropic's error shape; a draining server answers 529 overloaded_error.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from tfc.runtime.engine.generate import token_sha
from tfc.runtime.engine.request import Event, PromptError
from tfc.runtime.server import chat as chats
from tfc.runtime.server import sse
from tfc.runtime.server.admission import BadRequest, InFlight, Refusal, admit, drain, not_ready
from tfc.runtime.server.messages_errors import OVERLOADED, error_body, error_response, refused
from tfc.runtime.server.messages_protocol import CountTokensRequest, MessagesRequest, parse
from tfc.runtime.server.messages_reply import MessageBlocks, usage
from tfc.runtime.server.messages_request import Translated, translate
from tfc.runtime.server.state import ServerState

PREFIX = "/v1/messages"
PING = sse.event("ping", {"type": "ping"})


def owns(path: str) -> bool:
    """Whether a path is a Messages route (its refusals, 401 included, take Anthropic's shape)."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def register(app: FastAPI, state: ServerState) -> None:
    """Add the Messages routes to the app."""

    @app.post(PREFIX)
    async def create(request: Request):
        return await create_message(state, await request.body())

    @app.post(PREFIX + "/count_tokens")
    async def count_tokens(request: Request):
        return await count_message_tokens(state, await request.body())

    @app.api_route(PREFIX, methods=["GET", "PUT", "PATCH", "DELETE"])
    async def wrong_method(request: Request):
        return error_response(f"{request.method} is not allowed on {PREFIX}: POST a message", 405)

    @app.api_route(PREFIX + "/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"])
    async def unknown(rest: str):
        return error_response(f"no such route: {PREFIX}/{rest}", 404)


def _body(model: type, raw: bytes) -> Any:
    try:
        data = json.loads(raw)
    except ValueError:
        raise BadRequest("the body is not valid JSON", "body") from None
    return parse(model, data)


def _wrong_model(state: ServerState, model: str | None) -> JSONResponse | None:
    if model is None or model == state.model_name:
        return None
    return error_response(
        f"model: the model {model!r} does not exist (this server serves {state.model_name!r})", 404
    )


async def create_message(state: ServerState, raw: bytes):
    """Serve one Messages body: admission first, then a message or its event stream."""
    with InFlight(state) as flight:
        if state.status != "ready":
            return refused(not_ready(state))
        translated = None
        try:
            body = _body(MessagesRequest, raw)
            wrong = _wrong_model(state, body.model)
            if wrong is not None:
                return wrong
            translated = translate(body)
            job, (stream,) = await admit(state, translated.chat, True)
        except Refusal as no:
            return refused(no, _named(translated, no.message, no.param))
        state.metrics.requests.inc()
        reply = _Reply(state, "msg_" + secrets.token_hex(12), len(job.prompts[0]), translated.show_thinking)
        if body.stream:
            flight.hand_off()
            return StreamingResponse(
                reply.events(stream), media_type="text/event-stream", headers=sse.HEADERS
            )
        return await reply.whole(stream)


def _named(translated: Translated | None, message: str, param: str | None) -> str:
    """An error line with the chat field it names put as the Messages field."""
    if translated is None:
        return message
    message = translated.message(message, param)
    name = translated.param(param)
    return message if name is None or name in message else f"{name}: {message}"


async def count_message_tokens(state: ServerState, raw: bytes):
    """The prompt tokens a Messages body renders to: {"input_tokens": N}."""
    if not state.ready:
        return refused(not_ready(state))
    translated = None
    try:
        body = _body(CountTokensRequest, raw)
        wrong = _wrong_model(state, body.model)
        if wrong is not None:
            return wrong
        translated = translate(body)
        chat = translated.chat
        ids = await asyncio.to_thread(state.chat.render, chats.messages(chat), chats.options(chat))
    except BadRequest as bad:
        return refused(bad, _named(translated, bad.message, bad.param))
    except PromptError as bad:
        return error_response(_named(translated, str(bad), bad.param), 400)
    return {"input_tokens": len(ids)}


class _Reply:
    """One admitted message: its id, prompt size and thinking display; a whole reply or its events."""

    def __init__(self, state: ServerState, rid: str, prompt: int, show_thinking: bool) -> None:
        self.state, self.rid, self.prompt, self.show_thinking = state, rid, prompt, show_thinking

    def _head(self, blocks: MessageBlocks | None = None, last: Event | None = None) -> dict:
        reason, sequence = blocks.stop(last.finish) if last is not None else (None, None)
        counts = last.usage if last is not None else None
        return {"id": self.rid, "type": "message", "role": "assistant", "model": self.state.model_name,
                "content": blocks.content() if blocks is not None else [], "stop_reason": reason,
                "stop_sequence": sequence,
                "usage": usage(self.prompt, counts.completion_tokens, counts.cached_tokens)
                if counts is not None else usage(self.prompt, 0, 0)}  # fmt: skip

    def _failed(self, last: Event) -> tuple[str, int]:
        self.state.metrics.errors.inc()
        return last.error or "generation failed", OVERLOADED if self.state.status == "draining" else 500

    def _cut(self, blocks: MessageBlocks, last: Event) -> None:
        if blocks.cut_in_reasoning(last.finish):
            chats.warn_cut(self.rid, last.usage.completion_tokens)

    async def whole(self, stream) -> JSONResponse:
        """Wait for the reply; one message object."""
        blocks = MessageBlocks(self.show_thinking)
        parts, _, last, _ = await drain(stream)
        blocks.add(parts)
        if last.finish == "error":
            return error_response(*self._failed(last))
        self._cut(blocks, last)
        return JSONResponse({**self._head(blocks, last), "token_sha": token_sha(last.tokens)})

    async def events(self, stream):
        """message_start, pings until the first token, the blocks' events, message_delta, message_stop."""
        state, blocks = self.state, MessageBlocks(self.show_thinking)
        try:
            yield sse.event("message_start", {"type": "message_start", "message": self._head()})
            seen_token = False
            while True:
                if not seen_token and state.keepalive_s:
                    try:
                        last = await asyncio.wait_for(anext(stream), state.keepalive_s)
                    except TimeoutError:
                        yield PING
                        continue
                else:
                    last = await anext(stream)
                seen_token = True
                if last.finish == "error":
                    yield sse.event("error", error_body(*self._failed(last)))
                    return
                for name, data in blocks.add(last.text if isinstance(last.text, list) else []):
                    yield sse.event(name, data)
                if last.finish is not None:
                    break
            for name, data in blocks.close():
                yield sse.event(name, data)
            self._cut(blocks, last)
            head = self._head(blocks, last)
            yield sse.event("message_delta", {"type": "message_delta", "usage": head["usage"],
                                          "delta": {"stop_reason": head["stop_reason"], "stop_sequence": head["stop_sequence"]},
                                          "token_sha": token_sha(last.tokens)})  # fmt: skip
            yield sse.event("message_stop", {"type": "message_stop"})
        finally:
            stream.cancel()
            state.inflight -= 1
