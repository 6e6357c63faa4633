"""The engine's record of one request while it runs, the engine's settings, and the consumer's end of a request."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tfc.runtime.engine.detok import StopText
from tfc.runtime.engine.drafting import DRAFT_ROWS, DraftCounts
from tfc.runtime.engine.prefix_cache import PrefixChain, PrefixSettings
from tfc.runtime.engine.request import Event, Request
from tfc.runtime.engine.scheduler import Running

if TYPE_CHECKING:  # the engine imports this module
    from tfc.runtime.engine.engine import Engine


@dataclass(frozen=True)
class EngineConfig:
    """Slots and context the engine admits against, and how steps are cut."""

    max_seqs: int
    max_context: int
    chunk: int = 256  # prefill chunk, tokens
    max_step_tokens: int | None = None  # tokens a step holds: decode rows first, then prompt chunks that fit
    max_waiting: int = 64  # queued requests before 429
    retry_after_s: int = 1
    prefix: PrefixSettings | None = None  # the prefix cache's tiers (None: no prefix cache)
    draft: bool = True  # draft and verify where the runner can
    draft_off: str = "--no-draft"  # why, when `draft` is False
    draft_rows: int = DRAFT_ROWS  # rows a decode step's rows and their drafts fill together

    def budget(self, draft: int = 0) -> int:
        """Tokens a step may hold: `max_step_tokens`, or one chunk beside every decoding row (each with up to
        `draft` drafts)."""
        return self.max_step_tokens or self.chunk + self.max_seqs * (1 + draft)


@dataclass
class EngineSeq:
    """A request's life in the engine: its request, stop text, the queue its events go to, timings."""

    request: Request
    stops: StopText
    push: Callable[[Event], None]
    run: Running | None = None
    cancelled: bool = False
    first_token: float | None = None
    last_token: float | None = None
    started: float | None = None
    ids_out: list[int] = field(default_factory=list)
    chain: PrefixChain | None = None  # the digests of what it fed, with a prefix cache
    cached: int = 0  # prompt tokens restored from the prefix cache
    drafted: DraftCounts = field(default_factory=DraftCounts)
    prompt_logprobs: list = field(default_factory=list)  # its prompt's TokenLogprobs, until its first event


class Stream:
    """The consumer's end of one request: iterate events until one has `finish` set; `cancel` frees its slot."""

    def __init__(self, engine: Engine, seq: EngineSeq, queue: asyncio.Queue) -> None:
        self._engine, self._seq, self._queue = engine, seq, queue
        self.id = seq.request.id

    def __aiter__(self) -> Stream:
        return self

    async def __anext__(self) -> Event:
        if self._queue is None:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event.finish is not None:
            self._queue = None
        return event

    def cancel(self) -> None:
        """Stop generating for this request (a no-op once it finished)."""
        self._engine._cancel(self._seq)


def pusher(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue) -> Callable[[Event], None]:
    """A thread-safe put into an asyncio queue that tolerates a closed loop."""

    def push(event: Event) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody is listening
            loop.call_soon_threadsafe(queue.put_nowait, event)

    return push
