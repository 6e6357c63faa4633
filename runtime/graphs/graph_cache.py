"""Keyed CUDA-graph cache: capture a step the first time its key is seen, replay it afterwards.

Contract for a step (the callable passed to `GraphCache.run`):

* It reads only *static input buffers* and writes only *static output buffers*: device tensors
  allocated once (from the arena) before the first capture and never moved. Callers copy per-step
  inputs into the static inputs before `run` and read the static outputs after it.
* It is idempotent: running it twice on the same inputs writes the same outputs (capture warms it
  up eagerly, and a refused or failed capture runs it once more eagerly).
* No synchronisation, no device allocation that outlives the step, no host reads of device memory.
  Temporaries may be allocated inside the step: graphs share one memory pool, which is safe only
  because no temporary is alive after the step returns.
* The launch sequence depends only on the key, so replay equals eager bit for bit.

The buffers passed as `buffers=` are fingerprinted (FNV-1a over address and size); when a buffer
moves, every held graph is dropped. Every decision that could differ between ranks (room above the
memory floor, capture success) goes through the `agree` hook (an AND across ranks) outside any
capture, so all ranks capture, evict and fall back at the same steps; hits and LRU order agree
without communication because every rank meets the same keys in the same order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from tfc.errors import TfcError

FLOOR_MODES = ("shed", "hold")
FAIL_MODES = ("skip", "off")


class GraphSettingsError(TfcError):
    """Graph-cache settings that are invalid or differ between ranks."""


@dataclass(frozen=True)
class GraphSettings:
    """Graph-cache settings every rank must share (their digest is compared at start)."""

    max_graphs: int = 48
    min_keep: int = 8
    floor: str = "shed"  # shed | hold: what a miss below the memory floor does
    on_fail: str = "skip"  # skip: that key runs eagerly from now on; off: graphs off for the run
    dip_rounds: int = 64  # floor hits this many rounds after a prefill evict nothing
    warmup: int = 2  # eager runs on the side stream before a capture
    buckets: tuple[tuple[str, tuple[int, ...]], ...] = field(default=())  # e.g. (("rows", (1, 2, 4)),)

    def __post_init__(self) -> None:
        if self.max_graphs < 0 or self.min_keep < 0 or self.dip_rounds < 0 or self.warmup < 0:
            raise GraphSettingsError(f"graph settings must not be negative: {self}")
        if self.floor not in FLOOR_MODES:
            raise GraphSettingsError(f"graph floor mode {self.floor!r} is not one of {FLOOR_MODES}")
        if self.on_fail not in FAIL_MODES:
            raise GraphSettingsError(f"graph on_fail mode {self.on_fail!r} is not one of {FAIL_MODES}")

    @property
    def enabled(self) -> bool:
        """Whether graphs are on at all (max_graphs 0 means always eager)."""
        return self.max_graphs > 0

    def digest(self) -> str:
        """SHA-256 over the canonical JSON of every shared setting, bucket lists included."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class GraphStats:
    """Counters for metrics: hits replay a graph, misses reach the capture decision."""

    hits: int = 0
    misses: int = 0
    captures: int = 0
    evictions: int = 0
    fallbacks: int = 0  # captures that failed (on any rank) and ran eagerly
    eager: int = 0  # steps run eagerly for any reason
    drops: int = 0  # times every graph was dropped because a buffer moved
    floor_hits: int = 0  # misses refused because some rank was below its memory floor
    held: int = 0
    cap: int = 0


class CaptureBackend(Protocol):
    """How graphs are made: the real one uses CUDA, tests use a fake."""

    def capture(self, step: Callable[[], None]) -> Any: ...
    def replay(self, graph: Any) -> None: ...
    def release(self, graph: Any) -> None: ...


def local_agree(verdict: int) -> int:
    """The agreement of a world of one: its own verdict."""
    return verdict


# This process's rank world (runtime/parallel/world.py sets it when the world forms): its agreement and gather.
_WORLD: dict[str, Callable[..., Any] | None] = {"agree": None, "gather": None}


def use_world(agree: Callable[[int], int], gather: Callable[[str], list[str]]) -> None:
    """Route every GraphCache's agreement, and the settings check, through this process's rank world."""
    _WORLD["agree"], _WORLD["gather"] = agree, gather


def always_room() -> bool:
    """A memory floor that is never reached."""
    return True


def fingerprint(buffers: Sequence[Any]) -> int:
    """FNV-1a (64-bit) over (address, size) of each buffer: a tensor or an (address, size) pair."""
    h = 0xCBF29CE484222325
    for buf in buffers:
        if isinstance(buf, tuple):
            addr, size = buf
        else:
            addr, size = buf.data_ptr(), buf.numel() * buf.element_size()
        for word in (int(addr), int(size)):
            for shift in range(0, 64, 8):
                h = ((h ^ ((word >> shift) & 0xFF)) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


@dataclass
class _Entry:
    graph: Any
    fingerprint: int


class GraphCache:
    """LRU of captured graphs by key, with a memory floor, a cap and cross-rank agreement."""

    def __init__(
        self,
        settings: GraphSettings | None = None,
        backend: CaptureBackend | None = None,
        room: Callable[[], bool] = always_room,
        agree: Callable[[int], int] | None = None,
    ) -> None:
        self.settings = settings or GraphSettings()
        if self.settings.enabled and backend is None:
            backend = CudaGraphBackend(warmup=self.settings.warmup)
        self._backend = backend
        self._room = room
        self._agree = agree or _WORLD["agree"] or local_agree  # the rank world's, once one has formed
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._failed: set[Hashable] = set()
        self._off = not self.settings.enabled
        self._cap = self.settings.max_graphs
        self._round = 0
        self._prefill_round: int | None = None
        self._n = dict.fromkeys(
            ("hits", "misses", "captures", "evictions", "fallbacks", "eager", "drops", "floor_hits"), 0
        )

    @property
    def enabled(self) -> bool:
        """Whether a miss may still capture (false for max 0, the switch, or after `on_fail=off`)."""
        return not self._off

    @property
    def cap(self) -> int:
        """How many graphs may be held now (lowered by a shed, back to max once all ranks have room)."""
        return self._cap

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def keys(self) -> list[Hashable]:
        """Held keys, least recently used first."""
        return list(self._entries)

    @property
    def stats(self) -> GraphStats:
        """A snapshot of the counters."""
        return GraphStats(**self._n, held=len(self._entries), cap=self._cap)

    def note_prefill(self) -> None:
        """Mark this round as a prefill: memory dips for the next `dip_rounds` rounds shed nothing."""
        self._prefill_round = self._round

    def run(self, key: Hashable, step: Callable[[], None], buffers: Sequence[Any] = ()) -> bool:
        """Run `step` for `key`: replay its graph, capture one, or run eagerly. True when graphed."""
        self._round += 1
        if self._off or key in self._failed:
            return self._eager(step)
        fp = fingerprint(buffers)
        entry = self._entries.get(key)
        if entry is not None and entry.fingerprint != fp:
            # A static buffer moved: every graph may bake in stale addresses.
            self._n["drops"] += 1
            self.clear()
            entry = None
        if entry is not None:
            self._entries.move_to_end(key)
            self._n["hits"] += 1
            self._backend.replay(entry.graph)
            return True
        self._n["misses"] += 1
        if not self._agree(1 if self._room() else 0):
            return self._below_floor(step)
        self._cap = self.settings.max_graphs
        while len(self._entries) >= self._cap:
            self._evict_one()
        graph, ok = None, 1
        try:
            graph = self._backend.capture(step)
        except Exception:
            ok = 0
        if not self._agree(ok):
            if graph is not None:
                self._backend.release(graph)
            del graph
            self._n["fallbacks"] += 1
            if self.settings.on_fail == "off":
                self.clear()
                self._off = True
            else:
                self._failed.add(key)
            return self._eager(step)
        self._entries[key] = _Entry(graph, fp)
        self._n["captures"] += 1
        self._backend.replay(graph)
        return True

    def clear(self) -> None:
        """Release every held graph (the cap and counters stay)."""
        while self._entries:
            _, entry = self._entries.popitem(last=False)
            self._backend.release(entry.graph)

    def _below_floor(self, step: Callable[[], None]) -> bool:
        self._n["floor_hits"] += 1
        in_dip = (
            self._prefill_round is not None and self._round - self._prefill_round <= self.settings.dip_rounds
        )
        if self.settings.floor == "shed" and not in_dip:
            held = len(self._entries)
            shed = min((held + 3) // 4, max(0, held - self.settings.min_keep))
            for _ in range(shed):
                self._evict_one()
            self._cap = len(self._entries)
        return self._eager(step)

    def _evict_one(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self._backend.release(entry.graph)
        self._n["evictions"] += 1

    def _eager(self, step: Callable[[], None]) -> bool:
        self._n["eager"] += 1
        step()
        return False


class CudaGraphBackend:
    """torch.cuda.CUDAGraph on a side stream, warmed up eagerly, all graphs in one memory pool."""

    def __init__(self, warmup: int = 2, device: Any = None) -> None:
        import torch

        self._torch = torch
        self._warmup = warmup
        self._device = device
        self._stream: Any = None
        self._pool: Any = None

    def capture(self, step: Callable[[], None]) -> Any:
        """Warm the step up on the side stream, then capture it; raises when capture fails."""
        torch = self._torch
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=self._device)
            self._pool = torch.cuda.graph_pool_handle()
        side = self._stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self._warmup):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, pool=self._pool, stream=side, capture_error_mode="thread_local"):
                step()
        except BaseException:
            with contextlib.suppress(Exception):
                graph.reset()  # a capture that died half-way may refuse even this; the object is dropped
            raise
        return graph

    def replay(self, graph: Any) -> None:
        """Launch the graph on the current stream."""
        graph.replay()

    def release(self, graph: Any) -> None:
        """Free the graph's executable and its hold on the pool."""
        graph.reset()


def cuda_room(floor_bytes: int, device: Any = None) -> Callable[[], bool]:
    """A `room` callback: true while free device memory is at least `floor_bytes`."""
    import torch

    def room() -> bool:
        free, _ = torch.cuda.mem_get_info(device)
        return free >= floor_bytes

    return room


def dist_agree(group: Any = None) -> Callable[[int], int]:
    """An `agree` hook: AND of every rank's int32 verdict by an all-gather (serving.md section 6), outside any capture."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return local_agree
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    mine = torch.zeros(1, dtype=torch.int32, device=device)
    every = [torch.zeros(1, dtype=torch.int32, device=device) for _ in range(dist.get_world_size(group))]

    def agree(verdict: int) -> int:
        mine.fill_(1 if verdict else 0)
        dist.all_gather(every, mine, group=group)
        return int(min(int(v.item()) for v in every))

    return agree


def check_same_settings(settings: GraphSettings, gather: Callable[[str], list[str]] | None = None) -> None:
    """Refuse to run when another rank's graph settings differ (`gather` defaults to all_gather_object)."""
    digests = (gather or _WORLD["gather"] or _dist_gather)(settings.digest())
    if len(set(digests)) > 1:
        raise GraphSettingsError(
            f"graph settings differ between ranks (digests {sorted(set(digests))}); start every rank "
            "with the same settings and flags"
        )


def _dist_gather(digest: str) -> list[str]:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return [digest]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, digest)
    return out
