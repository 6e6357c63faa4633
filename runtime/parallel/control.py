"""Rank 0 drives, the others follow: each worker call is broadcast as a message, then every rank runs it.

Messages, in one order on every rank: `("step", StepPlan)`, `("release", slot)`, `("noop",)` (sent when
the channel has been quiet for a while, so a waiting rank's collective never times out) and `("stop",)`.
The engine talks to `Leader` as to any `ModelRunner` (`execute`, `release`, `info`, `capacity`, and
`capabilities`: none beyond steps, since only steps and releases are broadcast); the calls run
on one rank thread, so a call stuck in a collective with a lost rank can be abandoned: it raises
`WorldLost` in the engine's thread and every request in flight ends with an error.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from typing import TYPE_CHECKING, Any

from tfc.runtime.parallel.world import World, WorldLost
from tfc.runtime.worker.runner import ModelRunner, RunnerCapabilities
from tfc.runtime.worker.step import Capacity, ModelInfo, StepOutput, StepPlan

if TYPE_CHECKING:
    from tfc.runtime.worker.worker import Worker


TP_DRAFT_NOTE = "TP>1: the DSpark drafter runs at TP=1 only"


class _Call:
    """One message and, once every rank ran it, rank 0's result."""

    def __init__(self, message: tuple) -> None:
        self.message, self.result, self.error = message, None, None
        self.done = threading.Event()


class Leader:
    """Rank 0's worker for the engine: each call goes to every rank, then runs here; same contract as Worker."""

    def __init__(self, worker: Worker, world: World) -> None:
        self.worker, self.world = worker, world
        self.tick_s = max(1.0, min(30.0, world.timeout_s / 10))
        self.broadcast_s = 0.0  # seconds spent sending control messages (the control plane's cost)
        self.steps = 0
        self._calls: queue.Queue[_Call] = queue.Queue()
        self._current: _Call | None = None
        self._lost: str | None = None
        self._thread = threading.Thread(target=self._run, name="tfc-rank0", daemon=True)
        world.on_fail(self._abandon)
        self._thread.start()

    @property
    def info(self) -> ModelInfo:
        """The model's vocabulary, context and special ids."""
        return self.worker.info

    @property
    def capacity(self) -> Capacity:
        """Slots and tokens per slot (the same on every rank)."""
        return self.worker.capacity

    @property
    def capabilities(self) -> RunnerCapabilities:
        """Steps and releases only (no snapshots, no drafting: those calls are not broadcast); prompt rows as
        the ranks' runners take them."""
        return RunnerCapabilities(draft_note=TP_DRAFT_NOTE, prompt_rows=self.worker.capabilities.prompt_rows)

    def execute(self, plan: StepPlan) -> StepOutput:
        """Run one step on every rank; rank 0's logits."""
        return self._call(("step", plan))

    def release(self, slot: int) -> None:
        """Free a slot on every rank."""
        self._call(("release", slot))

    def chat_format(self, tokenizer: Any) -> Any:
        """The family's chat format (rank 0 alone renders and reads text)."""
        return self.worker.chat_format(tokenizer)

    def costs(self) -> dict[str, Any]:
        """What the world cost so far: steps, seconds in control broadcasts and in the forward's collectives."""
        stats = self.world.comm.stats.to_dict()
        return {"world": self.world.size, "steps": self.steps, "broadcast_s": round(self.broadcast_s, 6),
                "collectives": stats}  # fmt: skip

    def stop(self) -> None:
        """Announce a clean stop: every other rank exits 0 (once; later calls do nothing)."""
        if self._lost is None and self._thread.is_alive():
            self._call(("stop",))

    def _call(self, message: tuple) -> Any:
        if self._lost is not None:
            raise WorldLost(self._lost)
        call = _Call(message)
        self._calls.put(call)
        call.done.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def _abandon(self, reason: str) -> None:
        """The world is lost: the call in flight (maybe stuck in a collective) and every queued one raise."""
        self._lost = reason
        pending = [self._current] if self._current is not None else []
        while not self._calls.empty():
            pending.append(self._calls.get_nowait())
        for call in pending:
            call.error = WorldLost(reason)
            call.done.set()

    def _run(self) -> None:
        while self._lost is None:
            try:
                call = self._calls.get(timeout=self.tick_s)
            except queue.Empty:
                call = _Call(("noop",))
            self._current = call
            try:
                call.result = self._one(call.message)
            except BaseException as error:  # a rank-0 failure inside a step loses the world
                reason = str(error) if isinstance(error, WorldLost) else f"rank 0 failed: {_line(error)}"
                self.world.settle()  # a collective that broke because a peer died: let the watch name it
                self.world.fail(reason)
                call.error = WorldLost(self.world.reason or reason)
            self._current = None
            call.done.set()
            if call.message[0] == "stop":
                return

    def _one(self, message: tuple) -> Any:
        kind = message[0]
        if kind == "stop":
            self.world.finish()
            return None
        start = time.perf_counter()
        self.world.broadcast(message)
        self.broadcast_s += time.perf_counter() - start
        if kind == "step":
            self.steps += 1
            return self.worker.execute(message[1])
        if kind == "release":
            return self.worker.release(message[1])
        return None


def follow(worker: ModelRunner, world: World) -> None:
    """Ranks but 0: run rank 0's messages until it says stop; any failure loses the world (exit 70)."""
    try:
        while True:
            message = world.receive()
            kind = message[0]
            if kind == "step":
                worker.execute(message[1])
            elif kind == "release":
                worker.release(message[1])
            elif kind == "stop":
                world.finished()
                return
    except Exception as error:  # whatever it was, this rank can no longer follow
        world.settle()
        world.fail(f"rank {world.rank} failed: {_line(error)}")


def _line(error: BaseException) -> str:
    """An error as one short line: gloo's `[file:line] ` prefix and its advice dropped."""
    text = str(error).splitlines()[0] if str(error) else ""
    text = re.sub(r"^\[[^\]]*\]\s*", "", text).split(". ")[0]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
