"""Request bodies of the OpenAI routes (pydantic): known fields only, each range-checked, unknown fields refused."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_N = 16
MAX_STOPS = 16


class Strict(BaseModel):
    """A body whose unknown fields are a 400 naming the field."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(Strict):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant"]
    content: str | list[dict] | None = None
    name: str | None = None


class Sampling(Strict):
    """The generation fields the chat and completion routes share."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
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
    user: str | None = None
    presence_penalty: Annotated[float, Field(ge=0, le=0)] | None = None  # only 0 (off) is supported
    frequency_penalty: Annotated[float, Field(ge=0, le=0)] | None = None  # only 0 (off) is supported


class ChatCompletionRequest(Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]


class CompletionRequest(Sampling):
    prompt: str | list[Annotated[int, Field(ge=0)]] | list[str] | list[list[Annotated[int, Field(ge=0)]]]
    echo: Literal[False] = False


class TokenizeRequest(Strict):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(Strict):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]
