"""A rank waits for rank 0's store to listen before it dials (torch's own retry of an early dial backs off)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from tfc.runtime.parallel.ports import free_port
from tfc.runtime.parallel.world import WorldLost, await_store


def test_a_rank_joins_within_milliseconds_of_the_store_listening():
    port = free_port()
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)

    def listen_later() -> None:
        time.sleep(0.2)
        server.bind(("127.0.0.1", port))
        server.listen()

    opened = threading.Thread(target=listen_later)
    t0 = time.monotonic()
    opened.start()
    try:
        await_store("127.0.0.1", port, 10.0)
        waited = time.monotonic() - t0
    finally:
        opened.join()
        server.close()
    assert 0.2 <= waited < 0.8  # soon after it opened (5 ms polls; the bound leaves a loaded CI machine room)


def test_a_store_that_never_opens_is_one_error_within_the_timeout():
    port = free_port()
    t0 = time.monotonic()
    with pytest.raises(WorldLost, match=f"127.0.0.1:{port} did not open within 0.3 s"):
        await_store("127.0.0.1", port, 0.3)
    assert time.monotonic() - t0 < 1.5
