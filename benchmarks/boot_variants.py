"""The mmap upload's variants that boot runs 2-7 swept and the runtime no longer has, for the boot benchmarks.

`MmapVariant` is the runtime's `MmapStaging` with the options those runs timed beside the default: each piece's
page tables pre-faulted before its copy (`prefault` populate or willneed), kept afterwards (`drop=False`), the
host-to-device copies issued by one thread over `streams` streams (`issuer="single"`), and slots from torch's
pinned allocator (`pinning="torch"`). Its `upload` runs the Python copy loop as the runtime had it then, so
boot_h200.py and boot_pipeline_h200.py can time those rows again beside the default (benchmarks/boot.md).
`plan` turns a benchmark's configuration dict into the runtime's UploadPlan.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from tfc.runtime.boot import upload_files as uf
from tfc.runtime.boot import upload_mmap as um
from tfc.runtime.boot.pages import MADV_POPULATE_READ, MADV_WILLNEED, libc

PREFAULTS = ("none", "populate", "willneed")
ISSUERS = ("thread", "single")
PINNINGS = ("register", "torch")
VARIANT_KEYS = ("prefault", "drop", "issuer", "streams", "pinning")
SHAPE_KEYS = ("threads", "slot_bytes", "slots_per_thread", "copier")


@dataclass(frozen=True)
class MmapVariant(um.MmapStaging):
    """The mmap staging with the options the runtime dropped (the Python copy loop only)."""

    prefault: str = "none"  # page tables of a piece before copying it: none, populate or willneed
    drop: bool = True  # MADV_DONTNEED a piece's pages once copied
    issuer: str = "thread"  # who issues the host-to-device copies: each copy thread, or one thread
    streams: int = 2  # CUDA streams of the single issuer
    pinning: str = "register"  # how slots are page-locked: cudaHostRegister, or torch's allocator

    def __post_init__(self) -> None:
        super().__post_init__()
        for name, value, allowed in (("prefault", self.prefault, PREFAULTS), ("issuer", self.issuer, ISSUERS),
                                     ("pinning", self.pinning, PINNINGS)):  # fmt: skip
            if value not in allowed:
                raise uf.UploadError(f"mmap upload {name} {value!r} is not one of {allowed}")
        if self.streams < 1:
            raise uf.UploadError("the single issuer needs at least one stream")
        if self.copier != "python":
            raise uf.UploadError("the variants run on the Python copy loop only (copier python)")

    def describe(self) -> str:
        who = "per thread" if self.issuer == "thread" else f"by one issuer on {self.streams} streams"
        return (
            f"{self.threads} threads x {self.slot_bytes >> 20} MiB x {self.slots_per_thread} slots "
            f"({self.ring_bytes >> 20} MiB {self.pinning}), prefault {self.prefault}{', drop' if self.drop else ''}, "
            f"copies issued {who}"
        )

    def upload(self, arena: Any, files: uf.RankFiles, tick: uf.Progress) -> um.MmapTimes:
        return upload_variant(arena, files, self, tick)


def staging(cfg: dict) -> um.MmapStaging:
    """The mmap staging a configuration asks for: the runtime's default (staging_for) with its threads, slot
    size, slots and copier, as a MmapVariant when it names a variant option (which takes the Python loop)."""
    unknown = set(cfg) - set(SHAPE_KEYS) - set(VARIANT_KEYS)
    if unknown:
        raise uf.UploadError(f"unknown mmap upload options {sorted(unknown)}")
    variant = {k: cfg[k] for k in VARIANT_KEYS if k in cfg}
    base = um.staging_for(cfg.get("threads"), cfg.get("copier") or ("python" if variant else None))
    base = replace(base, **{k: cfg[k] for k in ("slot_bytes", "slots_per_thread") if cfg.get(k)})
    return MmapVariant(**asdict(base), **variant) if variant else base


def plan(upload_mod: Any, arena: Any, method: str, cfg: dict) -> Any:
    """The runtime's UploadPlan for `method` with a benchmark configuration's staging instead of the default's
    (the same plan as `tfc load` where cfg names nothing but threads)."""
    extra = set(cfg) - {"threads"}
    if method == "ring" and extra:
        if extra - {"slot_bytes", "slots_per_thread"}:
            raise uf.UploadError(f"ring takes threads, slot_bytes and slots_per_thread, not {sorted(extra)}")
        slot, per = cfg.get("slot_bytes", 16 << 20), cfg.get("slots_per_thread", 2)
        return upload_mod.UploadPlan("ring", cfg.get("threads") or upload_mod.THREADS, slot, per,
                                     notes=(f"{slot >> 20} MiB x {per} slots",))  # fmt: skip
    base = upload_mod.plan_upload(arena, method, cfg.get("threads"))
    if not extra:
        return base
    if base.method != "mmap":
        raise uf.UploadError(f"{sorted(extra)} only apply to upload method 'mmap' or 'ring', not {method!r}")
    st = staging(cfg)
    return replace(base, threads=st.threads, mmap=st, notes=(st.describe(),))


class TorchSlot:
    """A staging slot from torch's pinned allocator (pinning torch)."""

    take_s = 0.0

    def __init__(self, nbytes: int) -> None:
        import torch

        self.nbytes = nbytes
        self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        self.addr = self.tensor.data_ptr()

    def free(self) -> None:
        self.tensor = None


def slot(nbytes: int, pinning: str) -> Any:
    """A staging slot page-locked as `pinning` says (register: the runtime's own)."""
    return TorchSlot(nbytes) if pinning == "torch" else um.StagingSlot(nbytes)


class _Advice:
    """The per-piece madvise calls: pre-fault before the copy, drop after it."""

    def __init__(self, prefault: str, drop: bool) -> None:
        self.lib = libc()
        self.advice = {"none": 0, "populate": MADV_POPULATE_READ, "willneed": MADV_WILLNEED}[prefault]
        self.drop = drop

    def before(self, addr: int, n: int) -> None:
        if not self.advice:
            return
        start = addr - addr % uf.PAGE
        if self.lib.madvise(start, addr + n - start, self.advice) != 0 and self.advice == MADV_POPULATE_READ:
            self.advice = MADV_WILLNEED  # a kernel before 5.14: ask for read-ahead instead

    def after(self, addr: int, n: int) -> None:
        if self.drop:
            um.drop_pages(addr, n)


def upload_variant(arena: Any, files: uf.RankFiles, cfg: MmapVariant, tick: uf.Progress) -> um.MmapTimes:
    """The Python copy loop with the variant's prefault, drop, issuer and pinning."""
    import torch

    device = arena.device
    pieces, bases = um.mapped_pieces(arena, files, cfg.slot_bytes)
    work = uf.queue_of(pieces)
    threads = min(cfg.threads, max(1, len(pieces)))
    advice = _Advice(cfg.prefault, cfg.drop)
    stop = threading.Event()
    ready: queue.SimpleQueue = queue.SimpleQueue()  # (thread, slot, chunk, offset, length); None: done
    back = [queue.SimpleQueue() for _ in range(threads)]  # (slot, event after its last copy or None)
    last_copy = [0.0] * threads
    spent = [um.MmapTimes() for _ in range(threads)]
    slots: list[list[Any]] = [[] for _ in range(threads)]

    def copier(i: int) -> None:
        mine, own, stream, t = slots[i], cfg.issuer == "thread", None, spent[i]
        try:
            for k in range(cfg.slots_per_thread):
                back[i].put((k, None))
            torch.cuda.set_device(device)
            if own:
                stream = torch.cuda.Stream(device=device)
                events = [torch.cuda.Event(blocking=True) for _ in range(cfg.slots_per_thread)]
            with torch.cuda.stream(stream) if own else contextlib.nullcontext():
                while not stop.is_set():
                    try:
                        ci, path, foff, coff, n = work.get_nowait()
                    except queue.Empty:
                        break
                    t0 = time.perf_counter()
                    k, event = back[i].get()
                    if event is not None:
                        event.synchronize()  # the slot's previous copy has left it
                    t1 = time.perf_counter()
                    t.wait += t1 - t0
                    if k == len(mine):
                        mine.append(slot(cfg.slot_bytes, cfg.pinning))
                        t.staging += time.perf_counter() - t1
                        t.pool += mine[k].take_s
                        t1 = time.perf_counter()
                    if not t.first_copy:
                        t.first_copy = t1
                    src = bases[path][0] + foff
                    advice.before(src, n)
                    um._copy(mine[k].addr, src, n)
                    advice.after(src, n)
                    last_copy[i] = t2 = time.perf_counter()
                    t.copy += t2 - t1
                    if own:
                        arena.chunks[ci][coff : coff + n].copy_(mine[k].tensor[:n], non_blocking=True)
                        events[k].record(stream)
                        back[i].put((k, events[k]))
                    else:
                        ready.put((i, k, ci, coff, n))
                    t.issue += time.perf_counter() - t2
                    tick(n)
        finally:
            if stream is not None:
                stream.synchronize()
            if not own:
                ready.put(None)

    def issuer() -> None:
        streams: list[Any] = []
        events: dict[tuple[int, int], Any] = {}
        left, j, failure = threads, 0, None
        try:
            torch.cuda.set_device(device)
            streams = [torch.cuda.Stream(device=device) for _ in range(cfg.streams)]
        except Exception as e:
            failure = e
            stop.set()
        while left:
            item = ready.get()
            if item is None:
                left -= 1
                continue
            i, k, ci, coff, n = item
            event = None
            if failure is None:
                try:
                    stream = streams[j % len(streams)]
                    j += 1
                    with torch.cuda.stream(stream):
                        arena.chunks[ci][coff : coff + n].copy_(slots[i][k].tensor[:n], non_blocking=True)
                    event = events.get((i, k))
                    if event is None:
                        event = events[i, k] = torch.cuda.Event(blocking=True)
                    event.record(stream)
                except Exception as e:
                    failure = e
                    stop.set()
            back[i].put((k, event))  # always answer: a copy thread waiting for a slot must not hang
        for s in streams:
            s.synchronize()
        if failure is not None:
            raise failure

    def run(i: int) -> None:
        issuer() if i == threads else copier(i)

    try:
        uf.run_workers(threads + (1 if cfg.issuer == "single" else 0), run, on_error=stop.set)
        torch.cuda.synchronize(device)
    finally:
        for mine in slots:
            for s in mine:
                s.free()
        if cfg.pinning == "torch":
            uf.empty_host_cache(torch)  # the slots go back now, not at exit
    starts = [t.first_copy for t in spent if t.first_copy]
    total = um.MmapTimes(read_done=max(last_copy) or time.perf_counter(), first_copy=min(starts, default=0.0))
    for t in spent:
        total.add(t)
    return total
