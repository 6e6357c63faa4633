"""The body of `POST /v1/responses` (pydantic): the Responses fields this server serves, unknown ones refused.

`input`, `tools`, `tool_choice` and `text` stay loose here and are checked item by item where they are
translated (responses_input.py), so a refusal names the exact item and field (`input[2].call_id`).
Fields OpenAI defines but a stateless server cannot honour are listed in `refusals`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field
from tfc.runtime.server.protocol import Strict

MAX_METADATA = 16  # OpenAI's limits on `metadata`: pairs, key and value lengths
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512
INCLUDABLE = frozenset({"reasoning.encrypted_content"})  # reasoning comes back as plain text anyway


class ReasoningConfig(Strict):
    effort: Annotated[int, Field(ge=1, le=100)] | str | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None  # the older name of `summary`


class TextConfig(Strict):
    format: dict | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponseStreamOptions(Strict):
    include_obfuscation: bool | None = None  # nothing is obfuscated here: accepted, no effect


class ResponsesRequest(Strict):
    """One Responses request; tfc's extras (`seed`, `top_k`, `min_p`, `draft`) mean what they mean on chat."""

    model: str | None = None
    input: Any
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    reasoning: ReasoningConfig | None = None
    text: TextConfig | None = None
    max_output_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=100)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    metadata: Annotated[dict[str, str], Field(max_length=MAX_METADATA)] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None  # the prefix cache needs no key: accepted, no effect
    store: bool | None = None  # accepted; nothing is kept either way
    stream: bool | None = None
    stream_options: ResponseStreamOptions | None = None
    include: list[str] | None = None
    service_tier: Literal["auto", "default"] | None = None
    truncation: Literal["disabled"] | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    prompt: Any = None
    max_tool_calls: Annotated[int, Field(ge=0)] | None = None
    top_logprobs: Annotated[int, Field(ge=0)] | None = None
    seed: Annotated[int, Field(ge=0, le=(1 << 63) - 1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    draft: bool = True


def refusals(body: ResponsesRequest) -> tuple[str, str] | None:
    """(message, field) of the first field a stateless text server refuses; None when the body is servable."""
    verbosity = body.text.verbosity if body.text is not None else None
    checks = (
        (
            "previous_response_id",
            body.previous_response_id is not None,
            "this server keeps no responses (it is stateless); send the whole conversation in `input`",
        ),
        (
            "conversation",
            body.conversation is not None,
            "this server keeps no conversations; send the whole conversation in `input`",
        ),
        (
            "background",
            bool(body.background),
            "responses run in the foreground only (nothing is kept to poll)",
        ),
        ("prompt", body.prompt is not None, "stored prompt templates are not served; send `instructions`"),
        (
            "max_tool_calls",
            body.max_tool_calls is not None,
            "not supported; use tool_choice and parallel_tool_calls",
        ),
        ("top_logprobs", bool(body.top_logprobs), "logprobs are served on /v1/chat/completions, not here"),
        (
            "text.verbosity",
            verbosity not in (None, "medium"),
            "not supported (the model has no verbosity control)",
        ),
    )
    for name, refused, why in checks:
        if refused:
            return f"{name}: {why}", name
    for i, name in enumerate(body.include or ()):
        if name not in INCLUDABLE:
            return (
                f"include[{i}]: {name!r} is not served (only {', '.join(sorted(INCLUDABLE))})",
                f"include[{i}]",
            )
    if any(
        len(k) > MAX_METADATA_KEY or len(v) > MAX_METADATA_VALUE for k, v in (body.metadata or {}).items()
    ):
        why = f"keys are at most {MAX_METADATA_KEY} characters and values at most {MAX_METADATA_VALUE}"
        return f"metadata: {why}", "metadata"
    return None
