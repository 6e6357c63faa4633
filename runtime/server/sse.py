"""Server-sent events for the OpenAI routes: `data:` frames, `: keepalive` comments, the closing `[DONE]`."""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keepalive\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def frame(obj: dict) -> bytes:
    """One `data:` event holding a JSON object."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
