"""The staging faulted in ahead of the upload (runtime/boot/staging_pool.py), on the CPU with CUDA faked."""

from __future__ import annotations

import ctypes
import os
import time

import pytest
from tfc.runtime.boot import staging_pool as sp
from tfc.runtime.boot import upload_files as uf
from tfc.runtime.boot import upload_mmap as um
from tfc.runtime.boot.arena import DeviceArena, plan_arena

from tfc.errors import TfcError

PAGE = um.PAGE


@pytest.fixture(autouse=True)
def _no_pool_left():
    yield
    sp.release()


def test_pool_hands_out_its_slots_once_locked_in_one_call_then_releases_them():
    locks, unlocks = [], []

    def lock_pages(addr, nbytes):
        locks.append((addr, nbytes))
        return lambda: unlocks.append(addr)

    pool = sp.prefault(3 * PAGE, 4)
    assert sp.prefault(PAGE, 1) is None  # one pool per process: a second boot maps its own slots
    assert sp.take(2 * PAGE, lock_pages) is None and not locks  # another size: the caller maps its own
    got = [sp.take(3 * PAGE, lock_pages), sp.take(3 * PAGE, lock_pages)]
    assert all(a and a % PAGE == 0 for a in got) and got[1] - got[0] == 3 * PAGE
    assert locks == [(got[0], 4 * 3 * PAGE)]  # the whole region, once, by the first taker
    for a in got:  # private, writable, zero-filled memory
        assert ctypes.string_at(a, 3 * PAGE) == bytes(3 * PAGE)
        ctypes.memset(a, 0xAB, 3 * PAGE)
        assert ctypes.string_at(a + 3 * PAGE - 1, 1) == b"\xab"
    assert sp.note() == "staging prefaulted: 2 of 4 slots taken"
    assert sp.release() == 2 and unlocks == [got[0]]  # the two no one took; the region unlocked once
    assert sp.take(3 * PAGE, lock_pages) is None and sp.release() == 0
    assert pool.take(3 * PAGE, lock_pages) is None and pool.release() == 0


def test_a_failed_lock_hands_out_nothing_and_leaks_nothing():
    def refuse(addr, nbytes):
        raise TfcError("cudaHostRegister failed")

    sp.prefault(PAGE, 2)
    with pytest.raises(TfcError):
        sp.take(PAGE, refuse)
    assert sp.note() == "staging prefaulted: 0 of 2 slots taken" and sp.release() == 2


def test_mmap_upload_takes_the_prefaulted_slots(tmp_path, fake_cuda, monkeypatch):
    from test_runtime_upload_mmap import _files

    items, data = _files(tmp_path, [700_001, 3 * PAGE, 90_000])
    arena = DeviceArena(plan_arena(items, chunk_bytes=200_000), "cpu")
    cfg = um.MmapStaging(threads=3, slot_bytes=3 * PAGE, slots_per_thread=2)
    pooled = cfg.threads * cfg.slots_per_thread + 1
    sp.prefault(cfg.slot_bytes, pooled)
    slow = sp.StagingPool.take

    def take_slowly(self, nbytes, lock_pages):  # the pool's wait shows in the threads' summed `pool` step
        time.sleep(0.05)
        return slow(self, nbytes, lock_pages)

    monkeypatch.setattr(sp.StagingPool, "take", take_slowly)
    with uf.RankFiles(arena) as files:
        times = um.upload_mmap(arena, files, cfg, lambda n: None)
    for name, blob in data.items():
        assert arena.raw(name).numpy().tobytes() == blob, name
    assert fake_cuda.seen == [(pooled * cfg.slot_bytes, uf.REGISTER_PORTABLE)]  # one lock for every slot
    # slots the threads made (faked events free a slot at once; a thread that finds the queue empty makes none)
    made = sp._current().taken()
    assert 1 <= made <= cfg.threads * cfg.slots_per_thread
    assert times.pool >= 0.05 * made * 0.9 and times.staging >= times.pool
    assert sp.note() == f"staging prefaulted: {made} of {pooled} slots taken"
    assert len(fake_cuda.live) == 1  # the pool's region stays locked until the boot releases it
    assert sp.release() == pooled - made and not fake_cuda.live
    assert sp.note() == ""


@pytest.mark.parametrize(
    ("device", "method", "driver", "want"),
    [
        (None, None, True, True),
        ("auto", "mmap", True, True),
        ("cuda:1", "auto", False, True),
        (None, None, False, False),  # no NVIDIA driver: a CPU boot
        ("cpu", None, True, False),
        ("cuda", "ring", True, False),  # forced paths that never stage through the ring
        ("cuda", "register", True, False),
    ],
)
def test_prefault_only_where_the_mmap_path_may_run(monkeypatch, device, method, driver, want):
    monkeypatch.setattr(os.path, "exists", lambda p: driver and p == "/dev/nvidiactl")
    assert sp.wanted(device, method) is want


@pytest.mark.parametrize(
    ("env", "started"), [({}, 1), ({"TFC_PREFAULT": "0"}, 0), ({"TFC_PREFAULT": "on"}, 1)]
)
def test_the_prefault_is_the_boots_option_not_read_at_depth(tmp_path, monkeypatch, env, started):
    """TFC_PREFAULT reaches the boot as RuntimeOptions.prefault; the boot itself reads no variable."""
    from tfc.runtime.boot import rank as b
    from tfc.runtime.options import RuntimeOptions

    monkeypatch.setattr(sp, "wanted", lambda device, method: True)
    monkeypatch.setenv("TFC_PREFAULT", "0" if started else "1")  # what the process has is not what counts
    calls = []
    monkeypatch.setattr(sp, "prefault", lambda n, c: calls.append((n, c)) and None)
    with pytest.raises(TfcError):
        b.boot(tmp_path / "no-such-image", device="cpu", options=RuntimeOptions.from_settings(env=env))
    assert len(calls) == started


def test_boot_releases_the_pool_when_it_fails(tmp_path, monkeypatch):
    """A boot that fails after prefaulting leaves no pool behind (the next boot can start its own)."""
    from tfc.runtime.boot import rank as b

    monkeypatch.setattr(sp, "wanted", lambda device, method: True)
    started = []
    real = sp.prefault
    monkeypatch.setattr(sp, "prefault", lambda n, c: started.append((n, c)) or real(n, c))
    with pytest.raises(TfcError):
        b.boot(tmp_path / "no-such-image", device="cpu")
    cfg = um.staging_for()
    assert started == [(cfg.slot_bytes, cfg.threads * cfg.slots_per_thread)]
    assert sp.release() == 0  # boot already released it
