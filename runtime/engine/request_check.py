"""A request checked against what can ever run here (400s before anything is queued), and the reader that turns
its tokens into events."""

from __future__ import annotations

from typing import Any

from tfc.runtime.engine.detok import StopText
from tfc.runtime.engine.request import Rejected, Request


def check_request(request: Request, context: int, vocab_size: int) -> None:
    """Raise Rejected (400) for a request that can never run in `context` tokens over a `vocab_size` vocabulary."""
    need = len(request.prompt) + request.max_tokens
    if not request.prompt:
        raise Rejected(400, "the prompt is empty", "invalid_request_error", param="prompt")
    if need > context:
        raise Rejected(
            400,
            f"This model's maximum context length is {context} tokens. However, you requested {need} tokens "
            f"({len(request.prompt)} in the prompt, {request.max_tokens} for the completion).",
            "context_length_exceeded",
            param="messages",
        )
    if not 0 <= request.min_tokens <= request.max_tokens:
        raise Rejected(
            400,
            f"min_tokens must lie in [0, max_tokens={request.max_tokens}], got {request.min_tokens}",
            "invalid_request_error",
            param="min_tokens",
        )
    if any(not 0 <= t < vocab_size for t in request.prompt):
        raise Rejected(
            400,
            f"prompt token ids must lie in [0, {vocab_size})",
            "invalid_request_error",
            param="prompt",
        )


def reader_of(r: Request, tokenizer: Any) -> Any:
    """The request's reader: its own (told min_tokens when set), or text with its stop strings held back."""
    if r.reader is None:
        return StopText(tokenizer, r.stop_strings, r.min_tokens)
    return r.reader(min_tokens=r.min_tokens) if r.min_tokens else r.reader()


__all__ = ["check_request", "reader_of"]
