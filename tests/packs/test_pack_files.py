"""A pack's files are read only when regular: a pipe, device, socket or folder is refused by name, never waited on."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from support.hang import within as _within
from tfc.compiler.engram_map import TokenizerError, load_tokenizer
from tfc.compiler.errors import BuildError
from tfc.compiler.identity import pack_identity
from tfc.packs.deepseek_v41_config import load_config
from tfc.packs.errors import ConfigError, HeaderError, PackError
from tfc.packs.files import open_fd, read_bytes
from tfc.packs.safetensors_header import read_header
from tfc.packs.shards import read_index


@pytest.fixture
def fifo(tmp_path) -> Path:
    path = tmp_path / "config.json"
    os.mkfifo(path)
    return path


@pytest.fixture
def sock(tmp_path):
    path = tmp_path / "s.safetensors"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    yield path
    s.close()


def test_open_fd_refuses_what_is_not_regular(fifo, sock, tmp_path):
    for path, kind in ((fifo, "a named pipe"), (Path("/dev/null"), "a character device"), (sock, "a socket")):
        with pytest.raises(HeaderError, match=f"{path}: {kind}, not a regular file"):
            _within(10, open_fd, path, HeaderError)
    with pytest.raises(PackError, match="a directory"):
        open_fd(tmp_path)
    with pytest.raises(PackError, match="cannot read"):
        open_fd(tmp_path / "missing")


def test_regular_files_and_links_to_them_are_read(tmp_path):
    real = tmp_path / "blob"
    real.write_bytes(b"x" * 100)
    link = tmp_path / "config.json"
    link.symlink_to(real)  # packs are often snapshots linking into a download cache
    assert read_bytes(link, 100) == b"x" * 100
    with pytest.raises(ConfigError, match="over the 99-byte limit"):
        read_bytes(link, 99, ConfigError)


def test_every_pack_reader_refuses_a_pipe(fifo, tmp_path):
    with pytest.raises(ConfigError, match="named pipe"):
        _within(10, load_config, fifo)
    with pytest.raises(HeaderError, match="named pipe"):
        _within(10, read_header, fifo)
    with pytest.raises(TokenizerError, match="named pipe"):
        _within(10, load_tokenizer, fifo)
    with pytest.raises(BuildError, match="named pipe"):
        _within(10, pack_identity, [], [fifo])
    index = tmp_path / "model.safetensors.index.json"
    os.mkfifo(index)
    with pytest.raises(HeaderError, match="named pipe"):
        _within(10, read_index, tmp_path)


def test_endless_device_is_never_read(tmp_path):
    for name in ("model.safetensors.index.json", "tokenizer.json"):
        (tmp_path / name).symlink_to("/dev/zero")
    with pytest.raises(HeaderError, match="character device"):
        _within(10, read_index, tmp_path)
    with pytest.raises(TokenizerError, match="character device"):
        _within(10, load_tokenizer, tmp_path / "tokenizer.json")
