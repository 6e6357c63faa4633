"""Logprobs in OpenAI's two shapes: chat `logprobs.content` entries and the completions `logprobs` object."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from tfc.runtime.engine.logprobs import TokenLogprob


@lru_cache(maxsize=1)
def _byte_table() -> dict[str, int]:
    """The byte-level BPE alphabet: the character that stands for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenNames:
    """A token's text and raw bytes (a byte-level piece of a character keeps its bytes)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.name = lru_cache(maxsize=65536)(self._name)

    def _name(self, token: int) -> tuple[str, tuple[int, ...]]:
        text = self.tokenizer.decode([token], skip_special_tokens=False)
        piece = self.tokenizer.id_to_token(token) or ""
        table = _byte_table()
        if "\ufffd" in text and piece and all(ch in table for ch in piece):
            return text, tuple(table[ch] for ch in piece)
        return text, tuple(text.encode())


def chat_entries(names: TokenNames, logprobs: tuple[TokenLogprob, ...]) -> list[dict]:
    """`choices[].logprobs.content` entries."""
    out = []
    for lp in logprobs:
        text, raw = names.name(lp.token)
        top = [{"token": names.name(t)[0], "logprob": v, "bytes": list(names.name(t)[1])} for t, v in lp.top]
        out.append({"token": text, "logprob": lp.logprob, "bytes": list(raw), "top_logprobs": top})
    return out


def completion_logprobs(names: TokenNames, logprobs: tuple[TokenLogprob, ...], offset: int = 0) -> dict:
    """The completions `logprobs` object; `offset` is where this piece's text starts in the whole text."""
    tokens, values, tops, offsets = [], [], [], []
    for lp in logprobs:
        text = names.name(lp.token)[0]
        tokens.append(text)
        values.append(lp.logprob)
        top: dict[str, float] = {}
        for t, v in lp.top:  # ids that decode to the same text keep the first (the likelier) entry
            top.setdefault(names.name(t)[0], v)
        tops.append(top)
        offsets.append(offset)
        offset += len(text)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}


def echoed_logprobs(names: TokenNames, first: int, prompt: tuple[TokenLogprob, ...],
                    reply: tuple[TokenLogprob, ...] = ()) -> dict:  # fmt: skip
    """completion_logprobs of an echoed prompt and its reply: the prompt's first id has no logprob (None)."""
    head = names.name(first)[0]
    rest = completion_logprobs(names, (*prompt, *reply), len(head))
    return {"tokens": [head, *rest["tokens"]], "token_logprobs": [None, *rest["token_logprobs"]],
            "top_logprobs": [None, *rest["top_logprobs"]], "text_offset": [0, *rest["text_offset"]]}  # fmt: skip
