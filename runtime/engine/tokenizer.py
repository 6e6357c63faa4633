"""The tokenizer an image carries (prepare stores the pack's tokenizer.json), or one from a file."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from tfc.errors import TfcError


class TokenizerError(TfcError):
    """A tokenizer that cannot be loaded."""


def tokenizer_from_file(path: Path) -> Any:
    """A `tokenizers.Tokenizer` from a tokenizer.json file."""
    from tokenizers import Tokenizer

    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a pipe or device would hang or never end
            raise TokenizerError(f"{path}: not a regular file")
    except OSError as error:
        raise TokenizerError(f"{path}: cannot read the tokenizer ({error.strerror})") from None
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # the Rust library raises a bare Exception on bad files
        raise TokenizerError(f"{path}: not a usable tokenizer.json ({str(error).splitlines()[0]})") from None


def image_tokenizer(opened: Any, where: str) -> Any:
    """The tokenizer.json segment of an opened image."""
    from tokenizers import Tokenizer

    if "tokenizer.json" not in opened.image.segments:
        raise TokenizerError(f"{where}: the image carries no tokenizer.json; pass --tokenizer")
    try:
        return Tokenizer.from_str(bytes(opened.image.segment("tokenizer.json")).decode("utf-8"))
    except Exception as error:  # the Rust library raises a bare Exception on bad JSON
        raise TokenizerError(
            f"{where}: its tokenizer.json does not load ({str(error).splitlines()[0]})"
        ) from None
