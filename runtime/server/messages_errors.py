"""Errors in Anthropic's shape: {"type": "error", "error": {"type", "message"}} with the matching status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi.responses import JSONResponse

if TYPE_CHECKING:
    from tfc.runtime.server.admission import Refusal

OVERLOADED = 529  # Anthropic's status for a server that takes no work now (here: while it drains)
TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
         404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
         429: "rate_limit_error", OVERLOADED: "overloaded_error"}  # fmt: skip


def error_body(message: str, status: int) -> dict:
    """The error object of a reply or of a stream's `error` event (any other status is an api_error)."""
    return {"type": "error", "error": {"type": TYPES.get(status, "api_error"), "message": message}}


def error_response(
    message: str, status: int, retry_after: int | None = None, close: bool = False
) -> JSONResponse:
    """A JSON error reply; Retry-After and Connection: close when asked for."""
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if close:
        headers["Connection"] = "close"
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="tfc"'
    return JSONResponse(error_body(message, status), status_code=status, headers=headers)


def refused(refusal: Refusal, message: str | None = None) -> JSONResponse:
    """A route's refusal (runtime/server/admission.py) in this shape, `message` in place of its own: a draining
    server is overloaded (529, and the connection closed), a failed engine an api_error (500)."""
    if refusal.code == "server_restarting":
        return error_response(refusal.message, OVERLOADED, refusal.retry_after, close=True)
    status = 500 if refusal.code == "engine_dead" else refusal.status
    return error_response(message or refusal.message, status, refusal.retry_after)
