"""What a client asks of the engine, and what the engine sends back while it runs."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tfc.runtime.engine.logprobs import TokenLogprob
from tfc.runtime.engine.sampling import SamplingParams

from tfc.errors import TfcError

_ids = itertools.count()


def next_id(prefix: str = "req") -> str:
    """A process-unique request id."""
    return f"{prefix}-{next(_ids)}"


@dataclass(frozen=True)
class Request:
    """One sequence to generate: prompt ids, sampling, limits and stop rules (`seed` resolved by the caller).

    `constraint` (a TokenConstraint) masks the logits before sampling; `logprobs` asks for each token's
    logprob and that many alternatives (None: none); `prompt_logprobs` the same for every prompt token after the
    first (its prompt is then computed, never restored from the prefix cache); `reader` makes the object that turns generated ids into
    released pieces (default: text with `stop_strings` held back), e.g. a chat format's reply reader; it is called
    with `min_tokens=` when that is set. `min_tokens`: no stop id is drawn and no stop string ends the sequence
    before that many generated tokens (vLLM's rule).
    """

    prompt: tuple[int, ...]
    params: SamplingParams
    max_tokens: int
    stop_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()
    id: str = field(default_factory=next_id)
    arrival: float = field(default_factory=time.monotonic)
    constraint: Any = field(default=None, compare=False)
    logprobs: int | None = None
    reader: Callable[[], Any] | None = field(default=None, compare=False)
    draft: bool = True  # draft tokens and verify them in one step where the engine drafts (same tokens)
    prompt_logprobs: int | None = None
    min_tokens: int = 0


@dataclass(frozen=True)
class Usage:
    """Token counts and timings of one finished sequence."""

    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    e2e_s: float
    queue_s: float
    cached_tokens: int = 0  # prompt tokens restored from the prefix cache instead of computed
    drafts: int = 0  # draft-verify rounds
    draft_tokens: int = 0  # tokens those rounds drafted
    accepted_tokens: int = 0  # drafted tokens emitted as drafted


@dataclass(frozen=True)
class Event:
    """A piece of a running sequence: new text and ids, and on the last one why it ended.

    `finish` is "stop" or "length" on the last event of a sequence; `error` (with finish "error") says the
    engine could not finish it (drain deadline, engine failure). `token_ids` are the newly generated ids
    (a stop id included); `text` never shows a stop string or a part of one. With a request `reader`,
    `text` is what that reader released (a chat reply's parts) instead of a string.
    """

    text: Any
    token_ids: tuple[int, ...]
    finish: str | None = None
    error: str | None = None
    tokens: tuple[int, ...] = ()  # all generated ids, on the last event
    usage: Usage | None = None
    logprobs: tuple[TokenLogprob, ...] = ()  # one per id in token_ids, when the request asked
    prompt_logprobs: tuple[
        TokenLogprob, ...
    ] = ()  # on a sequence's first event: its prompt's ids after the first


class PromptError(TfcError):
    """A prompt or conversation a chat format cannot render; `param` names the offending field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


class Rejected(Exception):
    """A request refused before any byte of the reply: an HTTP status, an OpenAI error code, a retry hint."""

    def __init__(
        self, status: int, message: str, code: str, retry_after: int | None = None, param: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.code, self.retry_after, self.param = (
            status,
            message,
            code,
            retry_after,
            param,
        )
