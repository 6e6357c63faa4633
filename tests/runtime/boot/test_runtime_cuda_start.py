"""The early CUDA start (runtime/boot/cuda_start.py) with a stand-in for libcuda: which device, retained while the
boot runs, released after it, nothing at all without a driver or on the CPU."""

from __future__ import annotations

import ctypes

import pytest


class FakeCuda:
    """libcuda's calls the early start makes, recorded; `init` is cuInit's result."""

    def __init__(self, init: int = 0) -> None:
        self.calls: list[tuple] = []
        self.init = init

    def cuInit(self, flags):
        self.calls.append(("init", flags))
        return self.init

    def cuDeviceGet(self, dev, index):
        self.calls.append(("get", index))
        ctypes.cast(dev, ctypes.POINTER(ctypes.c_int))[0] = 40 + index
        return 0

    def cuDevicePrimaryCtxRetain(self, ctx, dev):
        self.calls.append(("retain", dev.value))
        return 0

    def cuDevicePrimaryCtxRelease_v2(self, dev):
        self.calls.append(("release", dev.value))
        return 0


@pytest.fixture
def fake_libcuda(monkeypatch):
    from tfc.runtime.boot import cuda_start

    fake = FakeCuda()
    monkeypatch.setattr(cuda_start.ctypes, "CDLL", lambda name: fake)
    monkeypatch.setattr(cuda_start.os.path, "exists", lambda p: p == "/dev/nvidiactl")
    return fake


@pytest.mark.parametrize(("device", "index"), [(None, 0), ("auto", 0), ("cuda", 0), ("cuda:3", 3)])
def test_early_start_retains_the_devices_primary_context_until_released(fake_libcuda, device, index):
    from tfc.runtime.boot import cuda_start

    early = cuda_start.start(device)
    early._thread.join()
    assert fake_libcuda.calls == [("init", 0), ("get", index), ("retain", 40 + index)] and early.retained
    early.release()
    assert fake_libcuda.calls[-1] == ("release", 40 + index) and not early.retained
    early.release()  # twice is harmless
    assert len(fake_libcuda.calls) == 4


def test_early_start_does_nothing_on_the_cpu_or_without_a_driver(fake_libcuda, monkeypatch):
    from tfc.runtime.boot import cuda_start

    assert cuda_start.start("cpu") is None and fake_libcuda.calls == []
    fake_libcuda.init = 100  # cuInit fails (no device): nothing retained, nothing released
    early = cuda_start.start("cuda")
    early.release()
    assert fake_libcuda.calls == [("init", 0)] and not early.retained

    def missing(name):
        raise OSError("libcuda.so.1: cannot open shared object file")

    monkeypatch.setattr(cuda_start.ctypes, "CDLL", missing)
    early = cuda_start.start("cuda")
    early.release()
    assert not early.retained
    monkeypatch.setattr(cuda_start.os.path, "exists", lambda p: False)
    assert (
        cuda_start.start(None) is None and cuda_start.start("auto") is None
    )  # the default, without a driver


def test_boot_starts_cuda_early_and_releases_it(monkeypatch, tmp_path):
    """boot() starts the context before anything else and releases its hold when done, even when the boot fails."""
    from tfc.runtime.boot import cuda_start
    from tfc.runtime.boot import rank as boot_mod

    events = []

    class Early:
        def release(self):
            events.append("release")

    def start(device):
        events.append(("start", device))
        return Early()

    monkeypatch.setattr(cuda_start, "start", start)
    with pytest.raises(Exception, match="manifest"):
        boot_mod.boot(tmp_path, device="cpu")  # an empty folder: open refuses it
    assert events == [("start", "cpu"), "release"]
