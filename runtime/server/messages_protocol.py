"""Request bodies of the Anthropic Messages routes (pydantic): the fields served here, unknown ones refused.

Content blocks and tool definitions are checked one at a time (`block`, `tool`), so a refusal names the
block by its place (`messages[2].content[1].type`) and says which kinds are served.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, Field, ValidationError
from tfc.runtime.server.admission import BadRequest, field_path
from tfc.runtime.server.protocol import MAX_STOPS, Strict

T = TypeVar("T", bound=BaseModel)
CacheControl = dict[str, Any] | None  # accepted and unused: the prefix cache keeps every prompt it can


class ThinkingConfig(Strict):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=1)] | None = None
    display: Literal["summarized", "omitted"] | None = None


class ToolChoice(Strict):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class OutputFormat(Strict):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(Strict):
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None
    format: OutputFormat | None = None


class Metadata(Strict):
    user_id: str | None = None


class MessageParam(Strict):
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class CountTokensRequest(Strict):
    """What decides the prompt: the body of /v1/messages/count_tokens, and the base of a Messages body."""

    model: str | None = None
    messages: Annotated[list[MessageParam], Field(min_length=1)]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    cache_control: CacheControl = None
    speed: Literal["standard"] | None = None


class MessagesRequest(CountTokensRequest):
    """A /v1/messages body; `seed` and `draft` are tfc's own (as on the OpenAI routes)."""

    max_tokens: Annotated[int, Field(ge=1)]
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    stream: bool = False
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=0)] | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    inference_geo: str | None = None
    container: Any = None  # refused when given: no code-execution containers here
    seed: Annotated[int, Field(ge=0, le=(1 << 63) - 1)] | None = None
    draft: bool = True


class TextBlock(Strict):
    type: Literal["text"]
    text: str
    cache_control: CacheControl = None
    citations: list[Any] | None = None  # an earlier reply's citations, sent back: accepted, unused


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl = None
    caller: dict[str, Any] | None = None


class ToolResultBlock(Strict):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[dict[str, Any]] | None = None
    is_error: bool | None = None
    cache_control: CacheControl = None


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class ToolDefinition(Strict):
    name: str
    input_schema: dict[str, Any]
    description: str | None = None
    type: Literal["custom"] | None = None
    cache_control: CacheControl = None
    strict: bool | None = None  # tool_choice any or tool holds calls to the schema whatever it says


BLOCKS: dict[str, type[BaseModel]] = {
    "text": TextBlock, "tool_use": ToolUseBlock, "tool_result": ToolResultBlock, "thinking": ThinkingBlock,
}  # fmt: skip


def block(raw: Any, where: str, allowed: tuple[str, ...]) -> Any:
    """One content block at `where`, of a kind in `allowed` (else a 400 that names the kinds served there)."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if not isinstance(kind, str):
        raise BadRequest(f"{where}: a content block is an object with a `type`", where)
    if kind not in allowed:
        served = ", ".join(allowed)
        raise BadRequest(f"{where}.type: {kind!r} blocks are not supported here (this server takes {served})",
                         f"{where}.type")  # fmt: skip
    return parse(BLOCKS[kind], raw, where)


def tool(raw: Any, where: str) -> ToolDefinition:
    """One tool definition: a custom tool (server tools such as web search are refused by name)."""
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in (None, "custom"):
        raise BadRequest(f"{where}.type: server tool {kind!r} is not supported; only custom tools "
                         "(name, description, input_schema) are", f"{where}.type")  # fmt: skip
    return parse(ToolDefinition, raw, where)


def parse(model: type[T], raw: Any, where: str = "") -> T:
    """`raw` validated as `model`; the first problem as a 400 naming its field (under `where`)."""
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        message, param = describe(error, where)
        raise BadRequest(message, param) from None


def describe(error: ValidationError, where: str = "") -> tuple[str, str]:
    """(one line, the field's path) of a validation error's first problem."""
    first = error.errors()[0] if error.errors() else {}
    loc = [p for p in first.get("loc", ()) if isinstance(p, int) or _is_field(str(p))]
    param = field_path([where] * bool(where) + loc) or "body"
    kind = first.get("type", "")
    if kind == "model_type" and param == "body":
        return "the body is not a JSON object", param
    if kind == "extra_forbidden":
        return f"{param}: unknown field", param
    if kind == "missing":
        return f"{param}: field required", param
    return f"{param}: {first.get('msg', 'invalid')}", param


def _is_field(part: str) -> bool:
    """Whether a location part names a field (pydantic also puts a union member's type there)."""
    return part.isidentifier() and part not in ("str", "int", "float", "bool", "dict", "list")
