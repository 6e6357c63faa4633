"""Shared pytest fixtures: synthetic packs built once per session."""

from __future__ import annotations

import importlib.util
import os
import sys

# One intra-op thread in every test process and the servers and ranks they start: tiny shapes, and several workers
# on a 2-core box, where more threads spin-wait on each other (set before torch is first imported, which reads it).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
from support.fakes import FakeCuda

from tfc import settings


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()


def pytest_runtest_logreport(report):
    """With TFC_INSTANT_FAILURES=1, a failure's traceback prints as it happens (a device run cut by its time
    limit still shows why the tests before the cut failed)."""
    if report.failed and settings.get("TFC_INSTANT_FAILURES"):
        sys.stderr.write(f"\n--- FAILED {report.nodeid} ({report.when})\n{report.longreprtext[-6000:]}\n")
        sys.stderr.flush()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def tiny_pack(tmp_path_factory):
    """The tiny synthetic DeepSeek-V4.1 pack, written once per session (treat as read-only)."""
    from tfc.fixtures.tiny import write_tiny

    out = tmp_path_factory.mktemp("tiny") / "pack"
    write_tiny(out)
    return out


@pytest.fixture(scope="session")
def tiny_image(tiny_pack, tmp_path_factory):
    """The tiny pack prepared at TP=1 once per session (the demo's image; treat as read-only)."""
    from click.testing import CliRunner

    from tfc.cli import cli

    store = tmp_path_factory.mktemp("tiny-store")
    result = CliRunner().invoke(cli, ["prepare", str(tiny_pack), "--tp", "1", "-o", str(store)])
    assert result.exit_code == 0, result.output
    return result.output.strip().splitlines()[-1]


@pytest.fixture(scope="session")
def flash_headers_pack(tmp_path_factory):
    """The full-geometry DeepSeek-V4.1-Flash pack with payloads as holes (treat as read-only)."""
    from tfc.fixtures.flash_headers import write_flash_headers

    out = tmp_path_factory.mktemp("flash") / "pack"
    write_flash_headers(out)
    return out


@pytest.fixture()
def fake_cuda(monkeypatch):
    """torch.cuda streams/events as no-ops, pinned memory as plain memory, host registrations recorded.

    `live` maps each registered address to its (size, flags) until it is unregistered; `seen` lists the
    (size, flags) of every registration.
    """
    import types

    import torch
    from tfc.runtime.boot import upload_files as up

    for name in ("Stream", "Event", "stream"):
        monkeypatch.setattr(torch.cuda, name, getattr(FakeCuda, name))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, pin_memory=False, **k: real_empty(*a, **k))
    live: dict[int, tuple[int, int]] = {}
    seen: list[tuple[int, int]] = []

    class Registrar:
        def register(self, ptr, size, flags=up.REGISTER_READ_ONLY | up.REGISTER_PORTABLE):
            assert ptr % up.PAGE == 0 and ptr not in live
            live[ptr] = (size, flags)
            seen.append((size, flags))

        def unregister(self, ptr):
            del live[ptr]

    monkeypatch.setattr(up, "Registrar", Registrar)
    return types.SimpleNamespace(live=live, seen=seen)
