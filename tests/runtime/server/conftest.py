"""Fixtures of the server tests: the tiny image, and one `tfc serve` process over it that they all share."""

from __future__ import annotations

import pytest
from support.server import ServerProcess


@pytest.fixture(scope="session")
def served_image(tiny_image):
    """The tiny TP=1 image (the demo's)."""
    return tiny_image


@pytest.fixture(scope="session")
def server(served_image, tmp_path_factory):
    """One server for every test here that needs no flags of its own: 16 slots, keepalives every 0.2 s."""
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    proc = ServerProcess(
        served_image, "--max-seqs", "16", "--model-name", "tiny", env={"TFC_SSE_KEEPALIVE_S": "0.2"}, log=log
    )
    with proc:
        yield proc


@pytest.fixture
def client(server):
    """The official OpenAI client pointed at the server."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
