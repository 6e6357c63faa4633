"""The staging faulted in ahead of the upload (runtime/staging_pool.py), on the CPU with CUDA faked."""

from __future__ import annotations

import ctypes

import pytest
from tfc.runtime import staging_pool as sp
from tfc.runtime import upload_mmap as um
from tfc.runtime.arena import DeviceArena, plan_arena

from tfc.errors import TfcError

PAGE = um.PAGE


@pytest.fixture(autouse=True)
def _no_pool_left():
    yield
    sp.release()


def test_pool_hands_out_its_slots_once_then_releases_the_rest():
    pool = sp.prefault(3 * PAGE, 4)
    assert sp.prefault(PAGE, 1) is None  # one pool per process: a second boot maps its own slots
    assert sp.take(2 * PAGE) is None  # another size: the caller maps its own
    got = [sp.take(3 * PAGE), sp.take(3 * PAGE)]
    assert all(a and a % PAGE == 0 for a in got) and len(set(got)) == 2
    for a in got:  # private, writable, zero-filled memory
        assert ctypes.string_at(a, 3 * PAGE) == bytes(3 * PAGE)
        ctypes.memset(a, 0xAB, 3 * PAGE)
        assert ctypes.string_at(a + 3 * PAGE - 1, 1) == b"\xab"
        sp.libc().munmap(a, 3 * PAGE)  # a taker owns what it took
    assert sp.release() == 2  # the two no one took
    assert sp.take(3 * PAGE) is None and sp.release() == 0
    assert pool.take(3 * PAGE) is None


def test_mmap_upload_takes_the_prefaulted_slots(tmp_path, fake_cuda):
    from test_runtime_upload_mmap import _files, _run

    items, data = _files(tmp_path, [700_001, 3 * PAGE, 90_000])
    arena = DeviceArena(plan_arena(items, chunk_bytes=200_000), "cpu")
    cfg = um.staging_for(threads=3, slots_per_thread=2, slot_bytes=3 * PAGE)
    pooled = cfg.threads * cfg.slots_per_thread + 1
    sp.prefault(cfg.slot_bytes, pooled)
    _run(arena, cfg)
    for name, blob in data.items():
        assert arena.raw(name).numpy().tobytes() == blob, name
    assert not fake_cuda.live  # every slot was unregistered (and unmapped by its _Slot)
    made = len(fake_cuda.seen)  # slots the threads made (faked events free a slot at once: 1+ per thread)
    assert cfg.threads <= made <= cfg.threads * cfg.slots_per_thread
    assert sp.note() == f"staging prefaulted: {made} of {pooled} slots taken"
    assert sp.release() == pooled - made  # every slot came from the pool; the rest are unmapped here
    assert sp.note() == ""


@pytest.mark.parametrize(
    ("device", "method", "env", "driver", "want"),
    [
        (None, None, None, True, True),
        ("auto", "mmap", None, True, True),
        ("cuda:1", "auto", None, False, True),
        (None, None, None, False, False),  # no NVIDIA driver: a CPU boot
        ("cpu", None, None, True, False),
        ("cuda", "ring", None, True, False),  # forced paths that never stage through the ring
        ("cuda", "register", None, True, False),
        ("cuda", None, "0", True, False),  # TFC_PREFAULT=0
    ],
)
def test_prefault_only_where_the_mmap_path_may_run(monkeypatch, device, method, env, driver, want):
    monkeypatch.setattr(sp.os.path, "exists", lambda p: driver and p == "/dev/nvidiactl")
    if env is None:
        monkeypatch.delenv("TFC_PREFAULT", raising=False)
    else:
        monkeypatch.setenv("TFC_PREFAULT", env)
    assert sp.wanted(device, method) is want


def test_boot_releases_the_pool_when_it_fails(tmp_path, monkeypatch):
    """A boot that fails after prefaulting leaves no pool behind (the next boot can start its own)."""
    from tfc.runtime import boot as b

    monkeypatch.setattr(sp, "wanted", lambda device, method: True)
    started = []
    real = sp.prefault
    monkeypatch.setattr(sp, "prefault", lambda n, c: started.append((n, c)) or real(n, c))
    with pytest.raises(TfcError):
        b.boot(tmp_path / "no-such-image", device="cpu")
    cfg = um.staging_for()
    assert started == [(cfg.slot_bytes, cfg.threads * cfg.slots_per_thread)]
    assert sp.release() == 0  # boot already released it
