"""The Engram compressed-token map: token ids whose text normalises alike share one compressed id."""

from __future__ import annotations

import hashlib
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tfc.packs.engram_layout import EngramConfigError, config_field
from tfc.packs.errors import PackError
from tfc.packs.files import read_bytes

SENTINEL = "\ue000"  # private-use: keeps a lone-space token from stripping to the empty string
_WS_RUN = re.compile(r"[ \t\r\n]+")
# Rust's char::is_whitespace (Unicode White_Space), which the reference's Strip() uses;
# Python's str.strip() also strips U+001C..U+001F, so it is not used.
_WHITE_SPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
MAX_TOKENIZER_BYTES = 256 << 20


class TokenizerError(PackError):
    """A tokenizer.json that cannot be read or parsed."""


class TokenMapMismatch(EngramConfigError):
    """The map built from a pack's tokenizer disagrees with its config."""


@dataclass(frozen=True)
class TokenMap:
    """Compressed id of every token id, the compressed vocabulary size and a digest of both."""

    ids: np.ndarray  # int32 [tokenizer length], values in 0..size-1
    size: int
    digest: str  # sha256 of the little-endian int32 map

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def normalise(text: str) -> str:
    """The Engram key of a decoded token: NFKC, NFD, drop marks, lowercase, collapse spaces, strip."""
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    text = "".join(ch.lower() for ch in text if not unicodedata.category(ch).startswith("M"))
    text = _WS_RUN.sub(" ", text)
    if text == " ":
        text = SENTINEL
    return text.strip(_WHITE_SPACE).replace(SENTINEL, " ")


def load_tokenizer(path: Path) -> Any:
    """A `tokenizers.Tokenizer` from a tokenizer.json, or TokenizerError naming the file."""
    from tokenizers import Tokenizer

    path = Path(path)
    data = read_bytes(path, MAX_TOKENIZER_BYTES, TokenizerError)  # a pipe or device refused, never read
    try:
        return Tokenizer.from_str(data.decode("utf-8"))
    except Exception as error:  # the Rust library raises a bare Exception on bad JSON
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise TokenizerError(f"{path}: not a valid tokenizer.json ({first})") from None


def build_token_map(tokenizer: Any) -> TokenMap:
    """Scan ids upward; each new normalised key gets the next compressed id (first appearance)."""
    if isinstance(tokenizer, str | Path):
        tokenizer = load_tokenizer(Path(tokenizer))
    n = tokenizer.get_vocab_size(with_added_tokens=True)
    texts = tokenizer.decode_batch([[i] for i in range(n)], skip_special_tokens=False)
    key_to_id: dict[str, int] = {}
    out = np.empty(n, dtype=np.int32)
    for i, text in enumerate(texts):
        if "\ufffd" in text:
            # a partial UTF-8 byte sequence: nothing to normalise, key by the raw vocab string
            key = tokenizer.id_to_token(i) or text
        else:
            key = normalise(text) or text
        out[i] = key_to_id.setdefault(key, len(key_to_id))
    return TokenMap(ids=out, size=len(key_to_id), digest=map_digest(out))


def map_digest(ids: np.ndarray) -> str:
    """sha256 of a token map as little-endian int32."""
    return hashlib.sha256(np.ascontiguousarray(ids, dtype="<i4").tobytes()).hexdigest()


def check_token_map(token_map: TokenMap, cfg: Any, source: Path | str = "tokenizer.json") -> None:
    """Refuse a map whose size differs from `engram_compressed_vocab_size` (hashes would be garbage)."""
    want = config_field(cfg, "engram_compressed_vocab_size")
    if token_map.size != want:
        raise TokenMapMismatch(
            f"{source}: the Engram map of this tokenizer has {token_map.size} compressed ids, "
            f"but config `engram_compressed_vocab_size` is {want}"
        )
    pad = config_field(cfg, "engram_pad_token_id") if _has(cfg, "engram_pad_token_id") else 2
    if not (isinstance(pad, int) and 0 <= pad < len(token_map)):
        raise TokenMapMismatch(f"{source}: Engram pad id {pad!r} is outside the tokenizer ({len(token_map)})")


def _has(cfg: Any, key: str) -> bool:
    try:
        config_field(cfg, key)
    except EngramConfigError:
        return False
    return True
