"""One streamed request to an OpenAI-compatible server, timed chunk by chunk; and the server's model list."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2

from tfc.bench import BenchError

PROBE_TIMEOUT_S = 30.0  # how long the model list may take before the URL is called unreachable
ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@dataclass(frozen=True)
class Outcome:
    """What one request measured: seconds from the send, and the gaps between chunks that carried tokens."""

    ok: bool
    latency_s: float
    ttft_s: float | None = None
    output_tokens: int = 0
    itl_s: tuple[float, ...] = ()
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (latency - TTFT) / (output tokens - 1)."""
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class RequestShape:
    """What every request of a run asks for, besides its prompt."""

    endpoint: str  # a key of ENDPOINTS
    model: str
    max_tokens: int
    ignore_eos: bool = False

    def body(self, prompt: str) -> dict:
        """A greedy streamed request whose last frame carries the usage."""
        body: dict = {"model": self.model, "max_tokens": self.max_tokens, "temperature": 0.0, "stream": True,
                      "stream_options": {"include_usage": True}}  # fmt: skip
        if self.endpoint == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        if self.ignore_eos:
            body["ignore_eos"] = True  # a vLLM extension (tfc, SGLang take it too); sent only when asked
        return body


def base_url(url: str) -> str:
    """The server's root from what a user typed: `host:8000`, `http://host:8000/`, `https://host/v1`."""
    if "://" not in url:
        url = "http://" + url
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port out of range or not a number
    except ValueError as error:
        raise BenchError(f"{url} is not a URL ({error})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(f"{url} is not an http:// or https:// URL")
    path = parts.path.rstrip("/")
    path = path.removesuffix("/v1")
    return f"{parts.scheme}://{parts.netloc}{path}"


async def served_models(client: httpx2.AsyncClient, base: str) -> list[str]:
    """The ids `GET /v1/models` lists, or a BenchError saying why this is not a usable OpenAI server."""
    try:
        response = await client.get(base + "/v1/models", timeout=PROBE_TIMEOUT_S)
    except (httpx2.HTTPError, httpx2.InvalidURL, OSError) as error:
        raise BenchError(f"cannot reach {base}: {_reason(error)}") from None
    if response.status_code in (401, 403):
        raise BenchError(
            f"{base} refused the key (HTTP {response.status_code}): pass --api-key or set OPENAI_API_KEY"
        )
    not_openai = f"{base} is not an OpenAI-compatible server: GET /v1/models"
    if response.status_code != 200:
        raise BenchError(f"{not_openai} answered HTTP {response.status_code}")
    try:
        listed = response.json()["data"]
        ids = [entry["id"] for entry in listed]
    except (ValueError, KeyError, TypeError):
        raise BenchError(f"{not_openai} did not answer a model list") from None
    if not ids or not all(isinstance(i, str) for i in ids):
        raise BenchError(f"{base} serves no model (GET /v1/models lists none)")
    return ids


async def stream_one(client: httpx2.AsyncClient, url: str, body: dict, timeout_s: float) -> Outcome:
    """Send one streamed request and time it; any failure becomes a failed Outcome, never an exception."""
    start = time.perf_counter()
    stamps: list[float] = []  # arrival of each chunk that carried tokens
    usage_tokens: int | None = None

    def failed(error: str) -> Outcome:
        return Outcome(ok=False, latency_s=time.perf_counter() - start, error=error)

    try:
        async with asyncio.timeout(timeout_s), client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                return failed(f"HTTP {response.status_code}: {_error_text(await response.aread())}")
            done_at = None
            async for line in response.aiter_lines():
                now = time.perf_counter()
                if done_at is not None or not line.startswith("data:"):
                    continue  # blank separators, ": keepalive" comments; after [DONE], read on to reuse the connection
                data = line[5:].strip()
                if data == "[DONE]":
                    done_at = now
                    continue
                event = json.loads(data)
                if not isinstance(event, dict):
                    return failed(f"stream frame is not an object: {data[:80]}")
                if "error" in event:
                    return failed(f"stream error: {_error_text(data.encode())}")
                usage = event.get("usage")
                if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                    usage_tokens = usage["completion_tokens"]
                if _carries_tokens(event):
                    stamps.append(now)
            if done_at is None:
                return failed("stream ended before [DONE]")
            return _finished(start, done_at, stamps, usage_tokens)
    except TimeoutError:
        return failed(f"no complete reply within {timeout_s:g} s")
    except ValueError:
        return failed("stream frame is not JSON")
    except (httpx2.HTTPError, OSError) as error:
        return failed(_reason(error))


def _finished(start: float, end: float, stamps: list[float], usage_tokens: int | None) -> Outcome:
    return Outcome(
        ok=True,
        latency_s=end - start,
        ttft_s=stamps[0] - start if stamps else None,
        output_tokens=usage_tokens if usage_tokens is not None else len(stamps),  # chunks when no usage came
        itl_s=tuple(b - a for a, b in itertools.pairwise(stamps)),
    )


def _carries_tokens(event: dict) -> bool:
    """Whether a chunk holds generated text: a completion's `text`, or a chat delta's content, reasoning or tool
    calls (the role-only first chunk and the finish chunk carry none)."""
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        if choice.get("text"):
            return True
        delta = choice.get("delta")
        if isinstance(delta, dict) and any(
            delta.get(k) for k in ("content", "reasoning_content", "reasoning", "tool_calls")
        ):
            return True
    return False


def _error_text(raw: bytes) -> str:
    """An error body's message (OpenAI's `{"error": {"message": ...}}`), else its first line, kept short."""
    text = raw.decode(errors="replace").strip()
    try:
        error = json.loads(text)["error"]
        text = str(error.get("message", error) if isinstance(error, dict) else error)
    except (ValueError, KeyError, TypeError):
        pass
    line = text.splitlines()[0] if text else "(empty body)"
    return line if len(line) <= 200 else line[:197] + "..."


def _reason(error: Exception) -> str:
    """A transport failure in a few words: the exception's own text, else its type."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
