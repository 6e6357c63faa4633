"""The serve command's wiring: join the rank world, listen, boot this rank's worker on a thread while /health
says booting, put the engine over it (over rank 0's Leader of every rank, at TP=N), serve HTTP, drain on a signal.

The HTTP package (runtime/server/) only serves an engine it is handed; booting a model happens here."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import uvicorn
from tfc.runtime.options import RuntimeOptions
from tfc.runtime.server.app import build_app
from tfc.runtime.server.auth import ApiKeys
from tfc.runtime.server.state import ServerState

from tfc import settings
from tfc.errors import TfcError

if TYPE_CHECKING:
    from tfc.runtime.parallel.control import Leader
    from tfc.runtime.parallel.world import World
    from tfc.runtime.worker.runner import ModelRunner
    from tfc.runtime.worker.worker import Worker


class ListenError(TfcError):
    """The address cannot be listened on."""


@dataclass(frozen=True)
class ServeOptions:
    """What `tfc serve` was asked for."""

    image: Path
    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str | None = None
    max_seqs: int | None = None  # None: as many as the runner's KV memory holds at its context
    max_context: int | None = None
    device: str = "auto"
    runtime: RuntimeOptions = field(default_factory=RuntimeOptions)  # every rank boots and joins with these
    jobs: int | None = None
    dtype: str = "float32"
    drain_s: float = 20.0
    chunk: int = 256
    max_step_tokens: int | None = None  # None: a chunk beside every slot's row and drafts
    max_waiting: int = 64
    prefix_cache: bool = True
    prefix_cache_gib: float = 1.0
    host_cache_gib: float = 0.0
    disk_cache: Path | None = None
    disk_cache_gib: float = 16.0
    draft: bool = True
    tokenizer: Path | None = None  # a tokenizer.json instead of the image's
    keepalive_s: float = settings.default("TFC_SSE_KEEPALIVE_S")  # between pre-token SSE comments; 0: none


def listen(host: str, port: int) -> socket.socket:
    """A bound, listening socket (one line of error when the address is taken or not ours)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise ListenError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None
    sock.listen(2048)
    return sock


def is_loopback(host: str) -> bool:
    """Whether an address only this machine can reach."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class DrainingServer(uvicorn.Server):
    """uvicorn whose first SIGTERM/SIGINT drains (serving.md section 4), the second cuts the drain short."""

    def __init__(self, config: uvicorn.Config, state: ServerState, drain_s: float) -> None:
        super().__init__(config)
        self.state, self.drain_s = state, drain_s
        self.signals = 0
        self.loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets=None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.signals += 1
        state = self.state
        if self.signals == 1 and state.status == "ready" and self.loop is not None:
            state.status = "draining"
            state.engine.draining = True
            say(
                f"draining: no new requests; {state.inflight} in flight get {self.drain_s:g} s (a second signal cuts it short)"
            )
            self.loop.call_soon_threadsafe(lambda: self.loop.create_task(self._drain()))
            return
        if self.signals <= 2:
            if state.engine is not None:
                state.engine.halt("the server is shutting down (drain cut short)")
            self.should_exit = True
            return
        self.force_exit = True

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.drain_s
        while self.state.inflight and time.monotonic() < deadline and not self.should_exit:
            await asyncio.sleep(0.02)
        if self.state.inflight and not self.should_exit:
            self.state.engine.halt("the server is shutting down (drain deadline)")
            until = time.monotonic() + 2.0
            while self.state.inflight and time.monotonic() < until:
                await asyncio.sleep(0.02)
        self.should_exit = True


@dataclass
class _Rank:
    """What the boot thread leaves for the shutdown: this rank's world, its worker and (rank 0 of a world) its leader."""

    world: World | None
    worker: Worker | None = None
    leader: Leader | None = None


def main(options: ServeOptions, keys: ApiKeys, started: float) -> int:
    """`tfc serve` on this process: join its rank world (if any); rank 0 (or the only rank) serves HTTP, any other
    rank runs rank 0's steps until it stops the world."""
    from tfc.runtime.parallel.session import join_world

    world = join_world(
        "serve", options.image, options.device, options.runtime, dtype=options.dtype, slots=options.max_seqs,
        context=options.max_context,
    )  # fmt: skip
    if world is not None and world.rank != 0:
        follow(options, world)
    return serve(options, keys, started, world)


def say(line: str) -> None:
    """One progress line on stderr."""
    print(f"tfc serve: {line}", file=sys.stderr, flush=True)


def serve(options: ServeOptions, keys: ApiKeys, started: float, world: World | None = None) -> int:
    """Listen, boot, serve until a signal; the exit code (0 after a drain, 2 when the boot failed).

    In a TP world (rank 0 of `world`) every step goes to every rank; a lost rank ends the requests in
    flight with an error and the process with 70 a second later; a clean stop lets the other ranks exit 0."""
    sock = listen(options.host, options.port)
    if not is_loopback(options.host) and not keys.enabled:
        say(f"warning: listening on {options.host} without an API key: anyone who can reach it can use it")
    name = options.model_name or f"deepseek-v41-{Path(options.image).resolve().name[:16]}"
    state = ServerState(model_name=name, keys=keys, keepalive_s=options.keepalive_s)
    config = uvicorn.Config(
        build_app(state), log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2,
        timeout_keep_alive=5,
    )  # fmt: skip
    server = DrainingServer(config, state, options.drain_s)
    rank = _Rank(world)
    if world is not None:
        world.fail_grace = 1.0  # time for the error events and 5xx replies to reach the clients
        world.on_fail(lambda why: _world_lost(state, why))
    thread = threading.Thread(
        target=_boot, args=(options, state, rank, started, lambda: setattr(server, "should_exit", True)),
        name="tfc-boot", daemon=True,
    )  # fmt: skip
    thread.start()
    try:
        server.run(sockets=[sock])
    finally:
        if state.engine is not None:
            state.engine.close()
        if rank.leader is not None:
            rank.leader.stop()  # every other rank exits 0
        if rank.worker is not None:
            rank.worker.close()
    if state.status == "failed":
        print(f"tfc: error: {state.failure}", file=sys.stderr, flush=True)
        return 2
    say("stopped")
    return 0


def _world_lost(state: ServerState, why: str) -> None:
    """A rank of the world is lost: /health fails, new requests get 503, the engine's requests end in errors."""
    state.failure, state.status = f"the rank world is lost: {why}", "failed"
    if state.engine is not None:
        state.engine.fatal = state.engine.fatal or state.failure


def _start_worker(options: ServeOptions, world: World | None) -> tuple[Worker, Callable[[], ModelRunner]]:
    """(this rank's booted worker, the call that loads its model); rank and device from the world, if any."""
    import torch
    from tfc.runtime.parallel.session import model_options
    from tfc.runtime.worker.worker import Worker

    rank, device = (None, options.device) if world is None else (world.rank, world.device)
    worker = Worker.start(options.image, rank=rank, device=device, options=options.runtime, jobs=options.jobs)
    # the fast runner's prefill steps as wide as the scheduler's prompt chunks (no padding rows on one prompt; a
    # TP=N rank's prompts take the decode steps); the reference runner takes no such option and drops it
    wide = options.chunk if options.chunk > 16 else 0  # 16 rows or fewer: the decode steps' own width
    return worker, lambda: worker.load_model(
        dtype=getattr(torch, options.dtype),
        slots=options.max_seqs,
        prefill_rows=wide,
        **model_options(world),
        **({"tokens_per_slot": options.max_context} if options.max_context else {}),
    )


def follow(options: ServeOptions, world: World) -> None:
    """A rank but 0 of a served world: boot, load, run rank 0's steps until it stops the world (exit 0)."""
    from tfc.runtime.parallel.session import lead_or_follow

    worker, load = _start_worker(options, world)
    try:
        load()
        lead_or_follow(world, worker)
    finally:
        worker.close()


def _boot(
    options: ServeOptions, state: ServerState, rank: _Rank, started: float, stop: Callable[[], None]
) -> None:
    """Boot the worker and the engine; mark the state ready, or failed with one line."""
    try:
        _boot_steps(options, state, rank, started)
    except Exception as error:  # every boot failure becomes one line and exit 2
        message = str(error).splitlines()[0] if str(error) else type(error).__name__
        if not isinstance(error, TfcError):
            message = f"{type(error).__name__}: {message}"
        state.failure, state.status = message, "failed"
        stop()


def _boot_steps(options: ServeOptions, state: ServerState, rank: _Rank, started: float) -> None:
    from tfc.runtime.engine.engine import Engine, EngineConfig
    from tfc.runtime.engine.metrics import EngineMetrics
    from tfc.runtime.engine.prefix_cache import GIB, PrefixSettings
    from tfc.runtime.engine.tokenizer import image_tokenizer, tokenizer_from_file
    from tfc.runtime.engine.warmup import runner_notes, stage_kernels, stages_line, warm_up
    from tfc.runtime.parallel.session import lead_or_follow

    worker, load = _start_worker(options, rank.world)
    rank.worker = worker
    for p in worker.booted.phases.phases:
        say(f"boot {p.name:<8} {p.seconds * 1e3:9.1f} ms  {p.note}")
    with worker.booted.phases.time("tokenizer"):
        if options.tokenizer is not None:
            tokenizer = tokenizer_from_file(options.tokenizer)
        else:
            tokenizer = image_tokenizer(worker.booted.image, str(options.image))
    runner = load()
    model_phase = worker.booted.phases.phases[-1]
    say(f"boot {model_phase.name:<8} {model_phase.seconds * 1e3:9.1f} ms  {model_phase.note}")
    context = min(options.max_context or runner.info.context, runner.info.context)
    slots = min(options.max_seqs or runner.capacity.slots, runner.capacity.slots)
    metrics = EngineMetrics(state.model_name)
    prefix = None
    if options.prefix_cache:
        prefix = PrefixSettings(
            int(options.prefix_cache_gib * GIB), int(options.host_cache_gib * GIB), options.disk_cache,
            int(options.disk_cache_gib * GIB),
        )  # fmt: skip
    config = EngineConfig(
        max_seqs=slots,
        max_context=context,
        chunk=options.chunk,
        max_step_tokens=options.max_step_tokens,
        max_waiting=options.max_waiting,
        prefix=prefix,
        draft=options.draft,  # where the runner states it can (a TP world's leader says why not)
    )
    steps: ModelRunner = worker  # what the engine drives: the worker, or in a TP world rank 0's Leader
    if rank.world is not None:
        steps = rank.leader = lead_or_follow(rank.world, worker)
    engine = Engine(steps, tokenizer, config, metrics)
    drafts = config.draft and steps.capabilities.draft
    note = ("one step of one token" + (", a draft" if drafts else "")
            + (", its snapshot restored" if prefix is not None else ""))  # fmt: skip
    with worker.booted.phases.time("warmup", note=note) as ph:
        warm_up(steps, runner.info.bos_id, snapshots=prefix is not None, draft=drafts)
    say(f"boot {ph.name:<8} {ph.seconds * 1e3:9.1f} ms  {ph.note}")
    stages = stage_kernels(runner)
    if stages:
        say(stages_line(stages))
    for note in runner_notes(runner):
        say(f"note: {note}")
    say(engine.prefix_note)
    say(engine.drafting.note)
    for note in runner.info.warnings:
        say(f"warning: {note}")
    metrics.boot_phases({p.name: p.seconds for p in worker.booted.phases.phases})
    engine.start()
    state.tokenizer, state.chat, state.metrics = tokenizer, worker.chat_format(tokenizer), metrics
    state.graphs = worker.booted.graphs
    state.engine = engine
    state.boot_s = round(time.monotonic() - started, 3)
    state.status = "ready"
    say(
        f"ready on http://{options.host}:{options.port} - model {state.model_name}, {slots} slots, "
        f"context {context} tokens, boot {state.boot_s:.2f} s"
    )
