"""free_port picks below the kernel's ephemeral range, where no outgoing connection can take it first."""

from __future__ import annotations

import socket

from tfc.runtime.parallel import ports


def test_a_free_port_lies_below_the_ephemeral_range_and_binds():
    low = ports.ephemeral_low()
    for _ in range(20):
        port = ports.free_port()
        assert ports.LOWEST <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_never_picked(monkeypatch):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    # every random pick is the busy port: each probe fails, and the kernel's pick is taken instead
    monkeypatch.setattr(ports, "LOWEST", busy)
    monkeypatch.setattr(ports, "ephemeral_low", lambda: busy + 1000)
    monkeypatch.setattr(ports.random.SystemRandom, "randrange", lambda self, lo, hi: lo)
    try:
        assert ports.free_port() != busy
    finally:
        taken.close()


def test_without_room_below_the_range_the_kernel_picks(tmp_path, monkeypatch):
    range_file = tmp_path / "range"
    range_file.write_text("10500\t60999\n")
    monkeypatch.setattr(ports, "_RANGE_FILE", str(range_file))
    assert ports.ephemeral_low() == 10500
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
    monkeypatch.setattr(ports, "_RANGE_FILE", str(tmp_path / "missing"))
    assert ports.ephemeral_low() == 32768
