"""Request bodies of the OpenAI routes (pydantic): known fields only, each range-checked, unknown fields refused."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field
from tfc.runtime.engine.sampling import MAX_REPETITION_PENALTY

MAX_N = 16
MAX_STOPS = 16
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # token ids a logit_bias may name (OpenAI's limit)


class Strict(BaseModel):
    """A body whose unknown fields are a 400 naming the field."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class CalledFunction(Strict):
    name: str
    arguments: str | dict | None = None


class ToolCall(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction
    index: int | None = None  # clients that send a streamed call back keep its index


class ChatMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None  # the same, under the name vLLM moved to; both are read
    refusal: str | None = None  # fields an OpenAI client sends back with a reply it got: accepted, unused
    annotations: list | None = None
    audio: dict | None = None
    function_call: dict | None = None


class FunctionDefinition(Strict):
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(Strict):
    name: str


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: NamedFunction


class JsonSchemaFormat(Strict):
    name: str | None = None
    description: str | None = None
    json_schema: dict | bool = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class ChatTemplateKwargs(Strict):
    thinking: bool | None = None
    enable_thinking: bool | None = None  # the alias some clients send
    reasoning_effort: Annotated[int, Field(ge=1, le=100)] | str | None = None


class ChatRendering(Strict):
    """The fields that decide how a conversation renders (shared by chat completions and /tokenize)."""

    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    reasoning_effort: Annotated[int, Field(ge=1, le=100)] | str | None = None


class Sampling(Strict):
    """The generation fields the chat and completion routes share."""

    model: str | None = None
    # 0: a completions echo's prompt scored, nothing generated (refused without echo)
    max_tokens: Annotated[int, Field(ge=0)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=0)] | None = None
    temperature: Annotated[float, Field(ge=0, le=100)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    seed: Annotated[int, Field(ge=0, le=(1 << 63) - 1)] | None = None
    n: Annotated[int, Field(ge=1, le=MAX_N)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOPS)] | None = None
    stop_token_ids: Annotated[list[Annotated[int, Field(ge=0)]], Field(max_length=64)] | None = None
    ignore_eos: bool = False
    min_tokens: Annotated[int, Field(ge=0)] = 0  # vLLM's: no stop ends the reply before this many tokens
    user: str | None = None
    presence_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0, le=MAX_REPETITION_PENALTY)] | None = (
        None  # vLLM's extra field
    )
    logit_bias: (
        Annotated[dict[str, Annotated[float, Field(ge=-100, le=100)]], Field(max_length=MAX_LOGIT_BIAS)]
        | None
    ) = None
    draft: bool = True  # tfc: draft and verify where the server drafts (false: one token a step; same tokens)


class ChatCompletionRequest(Sampling, ChatRendering):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None


class CompletionRequest(Sampling):
    prompt: str | list[Annotated[int, Field(ge=0)]] | list[str] | list[list[Annotated[int, Field(ge=0)]]]
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None


class TokenizeRequest(ChatRendering):
    """vLLM's /tokenize: a `prompt` (completion style) or `messages` (chat style, rendered as the chat route does)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # default: true for a prompt, false for messages (vLLM's defaults)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool | None = False


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]
