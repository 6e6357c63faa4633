"""Shared pytest fixtures: synthetic packs built once per session."""

from __future__ import annotations

import importlib.util

import pytest


def _has_cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


HAS_CUDA = _has_cuda()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


@pytest.fixture()
def one_torch_thread():
    """Tiny shapes: one intra-op thread avoids spin-waits on a loaded 2-core box."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_pack(tmp_path_factory):
    """The tiny synthetic DeepSeek-V4.1 pack, written once per session (treat as read-only)."""
    from tfc.fixtures.tiny import write_tiny

    out = tmp_path_factory.mktemp("tiny") / "pack"
    write_tiny(out)
    return out


@pytest.fixture(scope="session")
def flash_headers_pack(tmp_path_factory):
    """The full-geometry DeepSeek-V4.1-Flash pack with payloads as holes (treat as read-only)."""
    from tfc.fixtures.flash_headers import write_flash_headers

    out = tmp_path_factory.mktemp("flash") / "pack"
    write_flash_headers(out)
    return out
