"""The mmap upload path on the CPU (CUDA streams and events faked): bytes, failures, the auto choice."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time
import types
from pathlib import Path

import pytest
from tfc.runtime.boot import upload as up
from tfc.runtime.boot import upload_files as uf
from tfc.runtime.boot import upload_mmap as um
from tfc.runtime.boot import upload_native, upload_paths
from tfc.runtime.boot.arena import DeviceArena, UploadItem, plan_arena

PAGE = um.PAGE


def _staging(
    threads: int, slot_bytes: int, slots_per_thread: int = 2, copier: str = "python"
) -> um.MmapStaging:
    return um.MmapStaging(threads, slot_bytes, slots_per_thread, copier)


def _files(root: Path, sizes: list[int], seed: int = 0) -> tuple[list[UploadItem], dict[str, bytes]]:
    """Files of random bytes cut into segments at 4 KiB offsets (lengths not multiples of anything)."""
    items, data = [], {}
    for f, size in enumerate(sizes):
        blob = os.urandom(size)
        path = root / f"L{f:02d}.bin"
        path.write_bytes(blob)
        off, s = 0, 0
        while off < size:
            n = min(size - off, 9_000 + 37_011 * ((s + seed) % 5))
            items.append(UploadItem(f"{path.name}.{s}", path, off, n))
            data[f"{path.name}.{s}"] = blob[off : off + n]
            off = -(-(off + n) // 4096) * 4096
            s += 1
    return items, data


def _run(arena: DeviceArena, cfg: um.MmapStaging) -> tuple[float, float, int]:
    ticks: list[int] = []
    lock = threading.Lock()

    def tick(n: int) -> None:
        with lock:
            ticks.append(n)

    t0 = time.perf_counter()
    with uf.RankFiles(arena) as files:
        times = cfg.upload(arena, files, tick)
    steps = times.steps()
    assert min(steps.values()) >= 0 and steps["pool"] <= steps["staging"]
    assert t0 < times.first_copy <= times.read_done  # the first piece left the mapping before the last did
    return times.read_done, times.staging, sum(ticks)


def _check_bytes(arena: DeviceArena, data: dict[str, bytes], cfg: um.MmapStaging, fake_cuda) -> None:
    assert len(uf.pieces(arena, cfg.slot_bytes)) > 100
    read_done, staging, moved = _run(arena, cfg)
    assert moved == arena.nbytes and read_done > 0 and staging >= 0
    for name, blob in data.items():
        assert arena.raw(name).numpy().tobytes() == blob, name
    assert not fake_cuda.live  # every staging slot was unregistered
    registered = 0 if getattr(cfg, "pinning", "register") == "torch" else len(fake_cuda.seen)
    assert registered <= cfg.threads * cfg.slots_per_thread
    assert all(size == cfg.slot_bytes and not flags & uf.REGISTER_READ_ONLY for size, flags in fake_cuda.seen)


@pytest.mark.parametrize(("threads", "per"), [(3, 2), (4, 1), (5, 3)])
def test_mmap_upload_equals_file_bytes(tmp_path, fake_cuda, threads, per):
    items, data = _files(tmp_path, [1_000_003, 77_777, 3 * PAGE, 450_001])
    arena = DeviceArena(plan_arena(items, chunk_bytes=200_000), "cpu")
    _check_bytes(arena, data, _staging(threads, 3 * PAGE, per), fake_cuda)  # tiny slots: hundreds of pieces


def test_mmap_staging_is_checked():
    cfg = _staging(2, 1 << 20)
    assert cfg.describe() == "2 threads x 1 MiB x 2 slots (4 MiB staging)"
    assert um.staging_for(copier="python").threads == min(um.WARM_MMAP.threads, um.cpu_threads())
    for bad in (dict(slots_per_thread=0), dict(threads=0), dict(slot_bytes=PAGE + 5), dict(copier="rust")):
        with pytest.raises(up.UploadError, match="mmap upload"):
            dataclasses.replace(cfg, **bad)


def _one_line_failure(arena: DeviceArena, cfg: um.MmapStaging) -> str:
    """Run the upload on a thread (a hang fails the test instead of stalling it); return the error line."""
    out: list[BaseException] = []

    def go() -> None:
        try:
            _run(arena, cfg)
        except BaseException as e:
            out.append(e)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(60)
    assert not t.is_alive(), "the upload hung after a failure"
    assert len(out) == 1 and isinstance(out[0], up.UploadError), out
    msg = str(out[0])
    assert "\n" not in msg
    return msg


def test_mmap_copy_failure_is_one_typed_line(tmp_path, fake_cuda, monkeypatch):
    items, _ = _files(tmp_path, [600_000, 300_000])
    arena = DeviceArena(plan_arena(items), "cpu")
    calls = [0]
    real = um._copy

    def copy(dst, src, n):
        calls[0] += 1
        if calls[0] == 7:
            raise RuntimeError("CUDA error: an illegal memory access\nCompile with TORCH_USE_CUDA_DSA")
        return real(dst, src, n)

    monkeypatch.setattr(um, "_copy", copy)
    msg = _one_line_failure(arena, _staging(3, PAGE))
    assert msg == "upload thread failed: RuntimeError: CUDA error: an illegal memory access"
    assert not fake_cuda.live


def test_mmap_refuses_a_short_file_before_copying(tmp_path, fake_cuda):
    items, _ = _files(tmp_path, [300_000])
    arena = DeviceArena(plan_arena(items), "cpu")
    os.truncate(items[0].path, 100_000)  # a mapping read past its end would be SIGBUS
    with pytest.raises(up.UploadError, match=r"L00.bin ends at 100000, before the") as info:
        _run(arena, _staging(2, 64 * PAGE))
    assert "\n" not in str(info.value) and not fake_cuda.seen


def _cuda_arena(path: Path) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        device=types.SimpleNamespace(type="cuda"),
        plan=types.SimpleNamespace(chunks=[types.SimpleNamespace(path=path)]),
        nbytes=4096,
    )


def test_auto_takes_mmap_when_the_image_is_cached_and_ring_from_disk(tmp_path, monkeypatch):
    f = tmp_path / "image.bin"
    f.write_bytes(b"\xa5" * 4096)  # just written: every page is in the page cache
    arena = _cuda_arena(f)
    seen: list = []
    monkeypatch.setattr(uf, "RankFiles", lambda a: contextlib.nullcontext(None))
    monkeypatch.setattr(
        um, "upload_mmap", lambda a, files, cfg, tick: seen.append(cfg) or um.MmapTimes(staging=0.25)
    )
    monkeypatch.setattr(
        upload_paths, "upload_ring", lambda a, files, t, slot, per, tick: seen.append((t, slot, per)) or 0.0
    )
    warm = up.upload(arena)
    assert warm.method == "mmap" and seen[-1] == um.staging_for() and warm.staging_seconds == 0.25
    assert warm.threads == seen[-1].threads and "auto: 100% of the image in page cache" in warm.config
    assert up.upload(arena, "auto").method == "mmap"
    asked = up.upload(arena, "mmap", threads=5)
    assert seen[-1] == um.staging_for(5) and "auto" not in asked.config
    monkeypatch.setattr(up, "resident_fraction", lambda paths: 0.5)
    cold = up.upload(arena)
    assert cold.method == "ring" and seen[-1] == (up.THREADS, *up.COLD_RING)
    assert "auto: 50% of the image in page cache" in cold.config
    assert up.upload(arena, "mmap").method == "mmap"  # asked for by name: taken even when not cached


def test_tfc_load_offers_the_methods():
    from click.testing import CliRunner

    from tfc.cli.load_cmd import load

    text = CliRunner().invoke(load, ["--help"]).output
    assert "[auto|mmap|ring|register]" in text


def test_native_copier_through_upload_mmap(tmp_path, fake_cuda, monkeypatch):
    """copier native: the same bytes through the C loop (driver calls as host stand-ins), every slot waited for
    before reuse, its events destroyed, the context released and the staging unregistered."""
    import shutil

    import torch
    from support.fakes import FakeDriver

    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler")
    monkeypatch.setenv("TFC_NATIVE_CACHE", str(tmp_path / "native"))
    drv, state = FakeDriver(), {"destroyed": 0, "released": 0}

    class Driver:
        def calls(self):
            return drv.calls()

        def primary_context(self, index):
            return 0, lambda: state.__setitem__("released", state["released"] + 1)

        def events(self, n):
            return list(range(1000, 1000 + n))

        def destroy(self, events):
            state["destroyed"] += len(events)

    monkeypatch.setattr(upload_native, "CudaDriver", Driver)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    items, data = _files(tmp_path, [1_000_003, 77_777, 3 * PAGE, 450_001])
    arena = DeviceArena(plan_arena(items, chunk_bytes=200_000), "cpu")
    cfg = _staging(3, 3 * PAGE, 2, "native")
    _, _, moved = _run(arena, cfg)
    assert moved == arena.nbytes
    for name, blob in data.items():
        assert arena.raw(name).numpy().tobytes() == blob, name
    assert drv.copies == len(uf.pieces(arena, cfg.slot_bytes)) and drv.reused_unsynced == 0
    assert state == {"destroyed": 6, "released": 1} and not fake_cuda.live


def test_warm_default_follows_the_native_copier(monkeypatch):
    """Where the native copier can run the warm default is WARM_NATIVE (4 MiB x 2), else WARM_MMAP and the upload
    note says why; asking for a copier picks that copier's default."""
    monkeypatch.setattr(um, "native_ready", lambda: "")
    cfg = um.staging_for(16)
    assert (cfg.copier, cfg.slot_bytes, cfg.slots_per_thread) == ("native", 4 << 20, 2)
    assert um.staging_for(16, copier="python").slot_bytes == 8 << 20
    monkeypatch.setattr(um, "native_ready", lambda: "no compiler")
    assert um.staging_for(16) == um.staging_for(16, copier="python") == um.WARM_MMAP
    assert (
        um.staging_for(16, copier="native").copier == "native"
    )  # asked for: tried, and refused if it cannot
    assert um.copier_note(um.WARM_MMAP) == "Python copy threads: no compiler"
    assert um.copier_note(um.WARM_NATIVE) == ""


def test_native_copier_frees_its_slots_when_making_one_fails(tmp_path, fake_cuda, monkeypatch):
    """A slot that cannot be made (out of memory) fails the upload in one line, and the slots already made,
    the events and the context are given back."""
    import torch

    made, freed, state = [], [], {"destroyed": 0, "released": 0}

    class Slot:
        def __init__(self, nbytes):
            if len(made) == 2:
                raise up.UploadError("cannot map staging")
            made.append(self)
            self.addr, self.take_s = 0, 0.0

        def free(self):
            freed.append(self)

    class Driver:
        def primary_context(self, index):
            return 0, lambda: state.__setitem__("released", state["released"] + 1)

        def events(self, n):
            return list(range(n))

        def destroy(self, events):
            state["destroyed"] += len(events)

    monkeypatch.setattr(um, "StagingSlot", Slot)
    monkeypatch.setattr(upload_native, "CudaDriver", Driver)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    items, _ = _files(tmp_path, [300_001])
    arena = DeviceArena(plan_arena(items, chunk_bytes=200_000), "cpu")
    cfg = _staging(2, 3 * PAGE, 2, "native")
    with pytest.raises(up.UploadError, match="cannot map staging"), uf.RankFiles(arena) as files:
        um.upload_mmap(arena, files, cfg, lambda n: None)
    assert freed == made and len(made) == 2 and state == {"destroyed": 0, "released": 1}


def test_page_locking_goes_through_torchs_cudart(monkeypatch):
    """cudaHostRegister goes through torch's cudart binding, never importing cuda-python (0.07-0.13 s in a fresh
    process); a failing register is one UploadError line with the driver's code."""
    import sys
    import types

    import torch

    calls = []

    class Code:
        def __init__(self, value):
            self.value = value

    class Cudart:
        def __init__(self, code):
            self.code = code

        def cudaHostRegister(self, ptr, size, flags):
            calls.append(("register", ptr, size, flags))
            return Code(self.code)

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))

    poisoned = types.ModuleType("cuda.bindings")
    poisoned.__getattr__ = lambda name: pytest.fail("cuda-python imported")
    monkeypatch.setitem(sys.modules, "cuda", types.ModuleType("cuda"))
    monkeypatch.setitem(sys.modules, "cuda.bindings", poisoned)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart(0))
    reg = uf.Registrar()
    reg.register(4096, 8192, uf.REGISTER_PORTABLE)
    reg.unregister(4096)
    assert calls == [("register", 4096, 8192, uf.REGISTER_PORTABLE), ("unregister", 4096)]
    monkeypatch.setattr(torch.cuda, "cudart", lambda: Cudart(2))
    with pytest.raises(
        up.UploadError, match=r"cudaHostRegister \(staging\) of 8192 bytes failed with CUDA error 2"
    ):
        uf.Registrar().register(4096, 8192, uf.REGISTER_PORTABLE)
