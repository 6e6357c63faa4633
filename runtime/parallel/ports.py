"""A free TCP port on 127.0.0.1 below the kernel's ephemeral range, so no outgoing connection can take it first.

A port from bind(("127.0.0.1", 0)) is an ephemeral one: between closing the probe and the real bind, any client
connection on the host may be handed the same number (seen as "Address already in use" under parallel tests).
Ports under the range are never handed out by the kernel, so only another caller of this picking the same
random number (and then failing its probe bind) can collide.
"""

from __future__ import annotations

import random
import socket

LOWEST = 10000  # above the well-known and registered ports services usually take
TRIES = 200
_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 where the kernel does not say)."""
    try:
        with open(_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port nothing listens on right now, outside the ephemeral range where there is room (else any)."""
    high = ephemeral_low()
    pick = random.SystemRandom()
    if high - LOWEST >= 1000:
        for _ in range(TRIES):
            port = pick.randrange(LOWEST, high)
            if _binds(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _binds(port: int) -> bool:
    """Whether 127.0.0.1:port can be bound now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
