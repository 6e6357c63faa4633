"""The FastAPI application: routes, API-key guard, errors in the shape of the API each route belongs to."""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from tfc.runtime.engine.request import PromptError
from tfc.runtime.server import messages, tokens
from tfc.runtime.server.admission import Refusal, field_path
from tfc.runtime.server.auth import presented_key
from tfc.runtime.server.completions import generation
from tfc.runtime.server.errors import error_response, refused
from tfc.runtime.server.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from tfc.runtime.server.responses import create_response, not_kept
from tfc.runtime.server.responses_protocol import ResponsesRequest
from tfc.runtime.server.state import ServerState

OPEN_PATHS = frozenset({"/health"})


def build_app(state: ServerState) -> FastAPI:
    """The app over one server state (the engine may arrive later, while /health says booting)."""
    app = FastAPI(title="tfc", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.tfc = state

    @app.middleware("http")
    async def guard(request: Request, call_next):
        if state.keys.enabled and request.url.path not in OPEN_PATHS:
            key = presented_key(request.headers.get("authorization"), request.headers.get("x-api-key"))
            if not state.keys.allows(key):
                if messages.owns(request.url.path):
                    return messages.error_response("missing or invalid API key", 401)
                return error_response("missing or invalid API key", 401, "invalid_api_key")
        return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, error: RequestValidationError):
        first = error.errors()[0] if error.errors() else {}
        loc = [p for p in first.get("loc", ()) if p != "body"]
        param = field_path(loc) or None
        kind = first.get("type", "")
        if kind == "json_invalid" or (kind == "model_attributes_type" and not loc):
            return error_response("the body is not a JSON object", 400, "invalid_json")
        if kind == "extra_forbidden":
            return error_response(f"unknown field {param!r}", 400, "unknown_field", param)
        if kind == "missing":
            return error_response(f"field {param!r} is required", 400, "missing_field", param)
        return error_response(
            f"{param or 'body'}: {first.get('msg', 'invalid')}", 400, "invalid_value", param
        )

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, error: StarletteHTTPException):
        if error.status_code == 404:
            return error_response("no such route", 404, "not_found")
        return error_response(str(error.detail), error.status_code)

    @app.exception_handler(PromptError)
    async def bad_prompt(_: Request, error: PromptError):
        return error_response(str(error), 400, "invalid_prompt", error.param)

    @app.exception_handler(Refusal)
    async def refusal(_: Request, error: Refusal):
        return refused(error)

    @app.get("/health")
    async def health(request: Request):
        status = 200 if state.ready else 503
        headers = {} if state.ready else {"Retry-After": "5" if state.status == "booting" else "30"}
        key = presented_key(request.headers.get("authorization"), request.headers.get("x-api-key"))
        if state.keys.enabled and not state.keys.allows(key):
            return JSONResponse({"status": state.status}, status_code=status, headers=headers)
        return JSONResponse(_health(state), status_code=status, headers=headers)

    @app.get("/metrics")
    @app.get("/v1/metrics")
    async def metrics():
        if state.metrics is None:
            return Response(b"", media_type="text/plain; version=0.0.4")
        if state.graphs is not None:
            stats = state.graphs.stats
            state.metrics.graph_replays.set(stats.hits)
            state.metrics.graph_captures.set(stats.captures)
        return Response(state.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        if not state.ready:
            return error_response("the model is still booting: retry shortly", 503, "booting", retry_after=5)
        card = {"id": state.model_name, "object": "model", "created": int(state.started_wall), "owned_by": "tfc",
                "max_model_len": _context(state)}  # fmt: skip
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest):
        return await generation(state, body, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest):
        return await generation(state, body, chat=False)

    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest):
        return await create_response(state, body)

    app.add_api_route("/v1/responses/{response_id}", not_kept, methods=["GET", "DELETE"])
    messages.register(app, state)

    @app.post("/tokenize")
    @app.post("/v1/tokenize")
    async def tokenize(body: TokenizeRequest):
        if not state.ready:
            return error_response("the model is still booting: retry shortly", 503, "booting", retry_after=5)
        return tokens.tokenize(state, body, _context(state))

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize(body: DetokenizeRequest):
        if not state.ready:
            return error_response("the model is still booting: retry shortly", 503, "booting", retry_after=5)
        return tokens.detokenize(state, body)

    return app


def _context(state: ServerState) -> int:
    return min(state.engine.config.max_context, state.engine.info.context)


def _health(state: ServerState) -> dict:
    out = {"status": state.status, "ready": state.ready, "model": state.model_name, "inflight": state.inflight,
           "uptime_s": round(time.monotonic() - state.started, 3)}  # fmt: skip
    if state.failure:
        out["failure"] = state.failure
    if state.engine is not None:
        running, waiting = state.engine.counts()
        out.update(running=running, waiting=waiting, slots=state.engine.slots, context_length=_context(state),
                   steps=state.engine.steps, boot_s=state.boot_s)  # fmt: skip
        out.update(prefix_cache=state.engine.prefix_stats(), drafting=state.engine.draft_stats())
    return out
