"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the matching status."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi.responses import JSONResponse

if TYPE_CHECKING:
    from tfc.runtime.server.admission import Refusal

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
         500: "server_error", 503: "server_error"}  # fmt: skip


def error_body(message: str, status: int, code: str | None = None, param: str | None = None) -> dict:
    """The error object of a reply."""
    return {
        "error": {"message": message, "type": TYPES.get(status, "server_error"), "param": param, "code": code}
    }


def error_response(
    message: str, status: int, code: str | None = None, param: str | None = None,
    retry_after: int | None = None, close: bool = False,
) -> JSONResponse:  # fmt: skip
    """A JSON error reply; Retry-After and Connection: close when asked for."""
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    if close:
        headers["Connection"] = "close"
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="tfc"'
    return JSONResponse(error_body(message, status, code, param), status_code=status, headers=headers)


def refused(refusal: Refusal) -> JSONResponse:
    """A route's refusal (runtime/server/admission.py) as an error reply."""
    r = refusal
    return error_response(r.message, r.status, r.code, r.param, r.retry_after, r.close)
