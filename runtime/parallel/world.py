"""A rank's world: its process groups (gloo on the CPU; NCCL for tensors and gloo for control on CUDA), the
store, the control messages rank 0 broadcasts, and how the world stops (cleanly, or all ranks exit 70)."""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from tfc.runtime.options import RuntimeOptions
from tfc.runtime.parallel.comm import TorchCollectives
from tfc.runtime.parallel.env import EXIT_LOST, RankEnv, RankEnvError
from tfc.runtime.parallel.launch import NCCL_ENV
from tfc.runtime.parallel.monitor import Monitor, mark_failed

from tfc.errors import TfcError

STOP_WAIT_S = 15.0


class WorldLost(TfcError):
    """A rank of the world died, hung or failed: every rank stops (exit code 70)."""

    exit_code = EXIT_LOST


def await_store(addr: str, port: int, timeout_s: float, poll_s: float = 0.005) -> None:
    """Wait until rank 0's store (or the launcher's) listens at addr:port: torch retries a dial that came before
    it listened only after a backoff, so polling the port first joins as soon as it opens."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((addr, port), timeout=max(0.1, min(1.0, timeout_s))).close()
            return
        except OSError:
            if time.monotonic() >= deadline:
                raise WorldLost(
                    f"rank 0's store at {addr}:{port} did not open within {timeout_s:g} s"
                ) from None
            time.sleep(poll_s)


class World:
    """This process's rank of a TP world: groups, collectives, control messages, clean stop and fail-fast."""

    def __init__(
        self, env: RankEnv, device: str, control: Any, comm: TorchCollectives, options: RuntimeOptions
    ) -> None:
        self.env, self.device, self.control, self.comm = env, device, control, comm
        self.timeout_s = (
            options.tp_timeout_s
        )  # a collective that waits this long fails; liveness is the monitor's
        self.prefix = f"tfc/{env.run_id}/"
        self.fail_grace = 0.0  # seconds between a failure and exit 70 (rank 0's server answers in between)
        self._state = "running"  # running | stopping | failed
        self._lock = threading.Lock()
        self._on_fail: list[Callable[[str], None]] = []
        self._store: Any = None
        self.reason: str | None = None  # why the world was lost, once it is
        self.settings_digest: str | None = None  # what every rank agreed on at start (agreement.py)
        self.monitor = Monitor(
            env, self.prefix, self.fail, lambda: self._state != "running", options.tp_hang_s
        )

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def size(self) -> int:
        return self.env.world

    @classmethod
    def join(cls, env: RankEnv, device: str, options: RuntimeOptions) -> World:
        """Form the world (every rank calls this), start the fail-fast watch, route graph agreement through it;
        `options` give its collectives' timeout and its heartbeat's patience."""
        import torch
        import torch.distributed as dist
        from tfc.runtime.graphs import graph_cache

        timeout = timedelta(seconds=options.tp_timeout_s)
        if env.rank != 0:
            await_store(env.master_addr, env.master_port, options.tp_timeout_s)
        if device == "cuda":
            if torch.cuda.device_count() <= env.local_rank:
                raise RankEnvError(
                    f"LOCAL_RANK={env.local_rank} but this host has {torch.cuda.device_count()} GPU(s)"
                )
            for name, value in NCCL_ENV.items():
                os.environ.setdefault(name, value)
            torch.cuda.set_device(env.local_rank)
            dist.init_process_group(
                "nccl", init_method="env://", rank=env.rank, world_size=env.world, timeout=timeout,
                device_id=torch.device("cuda", env.local_rank),
            )  # fmt: skip
            control, device = dist.new_group(backend="gloo", timeout=timeout), f"cuda:{env.local_rank}"
        else:
            dist.init_process_group(
                "gloo", init_method="env://", rank=env.rank, world_size=env.world, timeout=timeout
            )
            control, device = None, "cpu"
        world = cls(env, device, control, TorchCollectives(env.world, env.rank), options)
        world.monitor.start()
        graph_cache.use_world(graph_cache.dist_agree(control), world.gather_objects)
        return world

    # -- messages -------------------------------------------------------------------------------------------

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's `obj` (picklable), in rank order, on every rank."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj, group=self.control)
        return out

    def broadcast(self, message: Any) -> None:
        """Rank 0: send one control message to every rank."""
        import torch.distributed as dist

        dist.broadcast_object_list([message], src=0, group=self.control)

    def receive(self) -> Any:
        """Ranks but 0: the next control message."""
        import torch.distributed as dist

        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=0, group=self.control)
        return box[0]

    def _client(self) -> Any:
        import torch.distributed as dist

        if self._store is None:
            self._store = dist.TCPStore(
                self.env.master_addr, self.env.master_port, is_master=False, timeout=timedelta(seconds=10)
            )
        return self._store

    def wait_all(self, name: str, poll_s: float = 0.02) -> None:
        """Wait until every rank reached `name` (as long as it takes: the monitor ends a lost world)."""
        key = f"{self.prefix}at/{name}"
        self._client().add(key, 1)
        while self._client().add(key, 0) < self.size:
            time.sleep(poll_s)

    # -- stopping ------------------------------------------------------------------------------------------

    def on_fail(self, callback: Callable[[str], None]) -> None:
        """Call `callback(reason)` when the world is lost, before this rank exits 70."""
        self._on_fail.append(callback)

    def fail(self, reason: str, store_ok: bool = True) -> None:
        """The world is lost: say why in one line, tell the others, run the callbacks, exit 70 (after the grace)."""
        with self._lock:
            if self._state != "running":
                return
            self._state, self.reason = "failed", reason
        print(f"tfc: error: rank {self.rank}: {reason}", file=sys.stderr, flush=True)
        if store_ok:
            mark_failed(self.env, self.prefix)
        for callback in self._on_fail:
            with contextlib.suppress(Exception):
                callback(reason)
        if self.fail_grace > 0:
            threading.Timer(self.fail_grace, os._exit, (EXIT_LOST,)).start()
        else:
            os._exit(EXIT_LOST)

    def settle(self, seconds: float = 0.5) -> None:
        """Wait a moment for the watch to report a lost rank (a broken collective says less than it does)."""
        deadline = time.monotonic() + seconds
        while self._state == "running" and time.monotonic() < deadline:
            time.sleep(0.01)

    def quiet(self) -> None:
        """Stop judging peers (every rank is about to refuse, or to stop): nothing counts as a failure now."""
        with self._lock:
            if self._state == "running":
                self._state = "stopping"
        self.monitor.stop()

    def finish(self) -> None:
        """Rank 0's clean stop: announce it, tell every rank to exit 0, wait until they have."""
        self.quiet()
        with contextlib.suppress(Exception):
            self._client().add(f"{self.prefix}stop", 1)
            self.broadcast(("stop",))
            deadline = time.monotonic() + STOP_WAIT_S
            while (
                self._client().add(f"{self.prefix}stopped", 0) < self.size - 1 and time.monotonic() < deadline
            ):
                time.sleep(0.02)
        self.close()

    def finished(self) -> None:
        """A follower's clean stop, on rank 0's word."""
        self.quiet()
        with contextlib.suppress(Exception):
            self._client().add(f"{self.prefix}stopped", 1)
        self.close()

    def close(self) -> None:
        """Leave the process groups (this rank is done with them)."""
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            dist.destroy_process_group()
