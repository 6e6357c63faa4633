"""Server-sent events: `data:` frames (chat and completions), typed `event:` frames (Messages, Responses),
`: keepalive` comments and the closing `[DONE]`."""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keepalive\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(obj: dict) -> bytes:
    """One `data:` event holding a JSON object."""
    return b"data: " + _json(obj) + b"\n\n"


def event(name: str, obj: dict) -> bytes:
    """One typed event: `event:` its name, `data:` a JSON object."""
    return b"event: " + name.encode() + b"\ndata: " + _json(obj) + b"\n\n"


def _json(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
