"""Tokenizers from a file: a pipe or a device is refused in one line, never read (it would hang)."""

from __future__ import annotations

import os

import pytest
from tfc.runtime.engine.tokenizer import TokenizerError, tokenizer_from_file


def test_a_pipe_is_refused_without_reading(tmp_path):
    fifo = tmp_path / "tokenizer.json"
    os.mkfifo(fifo)
    with pytest.raises(TokenizerError, match="not a regular file"):
        tokenizer_from_file(fifo)


def test_a_device_and_a_missing_file(tmp_path):
    with pytest.raises(TokenizerError, match="not a regular file"):
        tokenizer_from_file("/dev/zero")
    with pytest.raises(TokenizerError, match="cannot read"):
        tokenizer_from_file(tmp_path / "none.json")
