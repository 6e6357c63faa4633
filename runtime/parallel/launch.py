"""Start every rank of a TP=N world on this host, relay their output, forward stop signals, end them together.

Each rank is `python -m tfc <the same command>` with the launcher variables torchrun would set (RANK,
LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT) plus TFC_LAUNCHER, the world's run id (an internal setting,
tfc/settings.py): its stdin is this launcher's pipe, which says `lost ...` when another rank dies and reaches
end-of-file when the launcher is gone. The command's options reach every rank on the command line each reruns,
and the ranks compare them at start (agreement.py): no flag travels as a variable. Ranks run in their own
sessions, so a terminal's Ctrl-C reaches the launcher only; it forwards SIGTERM to rank 0, which drains and
stops the others. Stdlib only: the launcher never imports torch.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import IO, Any

from tfc.runtime.parallel.env import EXIT_LOST
from tfc.runtime.parallel.ports import free_port

from tfc import settings

GRACE_S = 3.0  # after a rank fails, the others get this long to exit on their own before SIGKILL
STOP_S = 15.0  # after rank 0 exits cleanly, the others get this long to follow
NCCL_ENV = {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}  # serving-peers.md section 5


def rank_environ(base: Mapping[str, str], rank: int, world: int, port: int, run: str) -> dict[str, str]:
    """The environment of one local rank: the launcher variables, one share of the CPU threads."""
    env = dict(base)
    env.setdefault("TFC_LAUNCH_T0", settings.text_of("TFC_LAUNCH_T0", time.time()))  # a benchmark's own stays
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world)))
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # a lost store is reported once, by tfc, in one line
    env.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TFC_LAUNCHER=settings.text_of("TFC_LAUNCHER", run),
    )  # fmt: skip
    for name, value in NCCL_ENV.items():
        env.setdefault(name, value)
    return env


def _fd(stream: Any) -> int | None:
    """The OS file descriptor behind a Python stream, or None (a captured stream: relay through a pipe)."""
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def _pump(source: IO[bytes], target: Any) -> None:
    """Copy a rank's output lines to a Python stream until the rank closes it."""
    with contextlib.suppress(ValueError, OSError):
        for line in iter(source.readline, b""):
            target.write(line.decode(errors="replace"))
            target.flush()


class Launch:
    """The ranks of one world on this host and what the launcher has seen of them."""

    def __init__(self, argv: Sequence[str], world: int, env: Mapping[str, str] | None = None) -> None:
        self.world, self.port, run = world, free_port(), uuid.uuid4().hex[:12]
        base = {**os.environ, **(env or {})}
        out_fd, err_fd = _fd(sys.stdout), _fd(sys.stderr)
        self.procs: list[subprocess.Popen] = []
        self.pumps: list[threading.Thread] = []
        for rank in range(world):
            stdout = (out_fd if out_fd is not None else subprocess.PIPE) if rank == 0 else subprocess.DEVNULL
            proc = subprocess.Popen(
                [sys.executable, "-m", "tfc", *argv], env=rank_environ(base, rank, world, self.port, run),
                stdin=subprocess.PIPE, stdout=stdout, stderr=err_fd if err_fd is not None else subprocess.PIPE,
                start_new_session=True,
            )  # fmt: skip
            self.procs.append(proc)
            for pipe, target in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
                if pipe is not None:
                    self.pumps.append(threading.Thread(target=_pump, args=(pipe, target), daemon=True))
                    self.pumps[-1].start()
        self.signalled: int | None = None

    def tell(self, line: str) -> None:
        """Send one line to every rank still running (a failure they must act on)."""
        for proc in self.procs:
            if proc.poll() is None and proc.stdin is not None:
                with contextlib.suppress(OSError, ValueError):
                    proc.stdin.write(line.encode() + b"\n")
                    proc.stdin.flush()

    def forward(self, signum: int, _frame: Any = None) -> None:
        """A stop signal for the world: rank 0 drains and stops the others (a second one cuts the drain)."""
        self.signalled = signum
        with contextlib.suppress(ProcessLookupError):
            self.procs[0].send_signal(signal.SIGTERM)

    def supervise(self, poll_s: float = 0.02) -> int:
        """Wait for the world to end; its exit code (0 clean, 2 refused at start, 70 a rank lost)."""
        seen: dict[int, int] = {}
        first_failure: tuple[int, int] | None = None
        deadline: float | None = None
        while True:
            now = time.monotonic()
            for rank, proc in enumerate(self.procs):
                code = proc.poll()
                if code is None or rank in seen:
                    continue
                seen[rank] = code
                if code != 0 and first_failure is None:
                    first_failure = (rank, code)
                    why = f"exited with {code}" if code > 0 else f"was killed by signal {-code}"
                    self.tell(f"lost rank {rank} {why}")
                    deadline = now + GRACE_S
                elif rank == 0 and deadline is None:
                    deadline = now + STOP_S
            if len(seen) == self.world:
                break
            if deadline is not None and now > deadline:
                for proc in self.procs:
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                for rank, proc in enumerate(self.procs):
                    seen.setdefault(rank, proc.wait())
                break
            time.sleep(poll_s)
        return self._code(seen, first_failure)

    def _code(self, seen: dict[int, int], first_failure: tuple[int, int] | None) -> int:
        if first_failure is not None and first_failure[1] == 2:
            return 2  # refused at start (settings, image): every rank said why
        if all(code == 0 for code in seen.values()):
            return 0
        if self.signalled is not None and first_failure is not None and first_failure[0] == 0:
            return 128 + self.signalled
        return EXIT_LOST

    def close(self) -> None:
        """Close the ranks' pipes and wait for the relays to drain."""
        for proc in self.procs:
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        for pump in self.pumps:
            pump.join(2.0)


def launch(argv: Sequence[str], world: int, env: Mapping[str, str] | None = None) -> int:
    """Run `tfc argv` as every rank of a TP=`world` world on this host; the world's exit code."""
    group = Launch(argv, world, env)
    pids = ", ".join(f"rank {r} pid {p.pid}" for r, p in enumerate(group.procs))
    print(f"tfc: TP={world}: {pids} (store on 127.0.0.1:{group.port})", file=sys.stderr, flush=True)
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT):
            handlers[signum] = signal.signal(signum, group.forward)
    try:
        return group.supervise()
    finally:
        for signum, old in handlers.items():
            signal.signal(signum, old)
        group.close()
