"""Fail-fast watch of a rank world: heartbeats through the store, and the launcher's pipe on stdin.

Every rank bumps its own counter in the store every `period` seconds and reads the others'; a counter
that stops moving for `hang_s` (a rank that hangs), a store that stops answering (its host is gone), a
`failed` mark (a rank that failed on its own) or a `lost` line from tfc's launcher (a local rank died)
all make this rank fail at once. After a clean stop is announced nothing counts as a failure.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

PERIOD_S = 0.25
START_GRACE_S = 10.0  # a rank's first heartbeat may take this long after the world formed


class Monitor:
    """The watch threads of one rank; `fail(reason, store_ok)` is called (once is enough) when the world is lost,
    a peer whose heartbeat stands still for `hang_s` among the reasons."""

    def __init__(
        self,
        env: Any,
        prefix: str,
        fail: Callable[[str, bool], None],
        stopping: Callable[[], bool],
        hang_s: float,
    ) -> None:
        self.env, self.prefix, self._fail, self._stopping = env, prefix, fail, stopping
        self.hang_s = hang_s
        self._done = threading.Event()

    def start(self) -> None:
        """Start the heartbeat thread (and the launcher-pipe thread when tfc launched this rank)."""
        threading.Thread(target=self._heartbeat, name="tfc-heartbeat", daemon=True).start()
        if self.env.launched:
            threading.Thread(target=self._launcher, name="tfc-launcher-pipe", daemon=True).start()

    def stop(self) -> None:
        """A clean stop: the threads end and judge nothing from now on."""
        self._done.set()

    def _lost(self, reason: str, store_ok: bool = True) -> None:
        if not self._done.is_set() and not self._stopping():
            self._fail(reason, store_ok)

    def _launcher(self) -> None:
        # os.read, not sys.stdin: a daemon thread blocked in a buffered read would hang interpreter shutdown
        pending = b""
        with contextlib.suppress(OSError):
            while chunk := os.read(0, 4096):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    text = line.decode(errors="replace").strip()
                    if text.startswith("lost "):
                        self._lost(text[len("lost ") :])
                        return
        self._lost("the launcher is gone")

    def _heartbeat(self) -> None:
        import torch.distributed as dist

        env, p = self.env, self.prefix
        try:
            store = dist.TCPStore(
                env.master_addr, env.master_port, is_master=False, timeout=timedelta(seconds=2.0)
            )
        except Exception as error:  # any failure to reach the store loses the world
            self._lost(f"cannot reach the world's store ({type(error).__name__})", False)
            return
        peers = [r for r in range(env.world) if r != env.rank]
        seen = dict.fromkeys(peers, 0)
        moved = dict.fromkeys(peers, time.monotonic() + START_GRACE_S - self.hang_s)
        while not self._done.wait(PERIOD_S):
            try:
                store.add(f"{p}hb/{env.rank}", 1)
                if store.add(f"{p}stop", 0):
                    return  # rank 0 announced a clean stop
                if store.add(f"{p}failed", 0):
                    self._lost("another rank failed")
                    return
                now = time.monotonic()
                for peer in peers:
                    count = store.add(f"{p}hb/{peer}", 0)
                    if count != seen[peer]:
                        seen[peer], moved[peer] = count, now
                    elif now - moved[peer] > self.hang_s:
                        self._lost(f"rank {peer} stopped answering ({self.hang_s:g} s without a heartbeat)")
                        return
            except Exception as error:  # the store's host (rank 0 or torchrun) is gone
                self._lost(f"the world's store stopped answering ({type(error).__name__})", False)
                return


def mark_failed(env: Any, prefix: str, wait_s: float = 0.5) -> None:
    """Tell the other ranks through the store that this one failed (best effort, bounded in time)."""

    def mark() -> None:
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            store = dist.TCPStore(
                env.master_addr, env.master_port, is_master=False, timeout=timedelta(seconds=1.0)
            )
            store.add(f"{prefix}failed", 1)

    thread = threading.Thread(target=mark, daemon=True)
    thread.start()
    thread.join(wait_s)
