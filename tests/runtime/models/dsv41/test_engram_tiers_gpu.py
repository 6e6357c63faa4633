"""Engram rows off the device on a GPU (skipped without CUDA): the tiny pack prepared with its Engram tables in
pinned host memory and on NVMe gives the device tier's logits bit for bit, graph-replayed and eager, a prompt
then decode steps beside another slot (each step's staged records copied inside the captured step on a side
stream); the host tier and the staging are page-locked. Cold expert tables in mapped host memory, read by the
MoE kernels over PCIe in place, give the same bits.
Run: python -m pytest -q -p no:cacheprovider tests/runtime/models/dsv41/test_engram_tiers_gpu.py
"""

from __future__ import annotations

import pytest
import torch
from support.fast_steps import decode_alongside
from support.tier_images import tier_image
from tfc.runtime.boot.mapped import device_pointer

pytestmark = pytest.mark.gpu

FAST = {"slots": 4, "tokens_per_slot": 512, "context_step": 256, "page_tokens": 64}


@pytest.fixture(scope="module")
def images(tiny_pack, tmp_path_factory):
    return {
        t: tier_image(tiny_pack, tmp_path_factory.mktemp(t), t)
        for t in ("device", "host", "mixed", "nvme", "cold")
    }


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 640, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(image, graphs: bool, check=None) -> torch.Tensor:
    """Logits [64, V] of 64 tokens fed one a step while another slot feeds 0, 1, 16 or 3 tokens of its own."""
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast.build import build_fast
    from tfc.runtime.options import RuntimeOptions

    booted = boot(image, device="cuda", options=RuntimeOptions(graphs=graphs))
    try:
        runner = build_fast(booted, **FAST)
        if check is not None:
            check(booted, runner)
        other = {1: _tokens(330, 3)}
        got = decode_alongside(runner, 0, _tokens(64, 2), other, lambda i, s: (0, 1, 16, 3)[i % 4])
        return got.cpu()
    finally:
        booted.close()


def test_off_device_tiers_give_the_device_tiers_bits(images):
    want = _run(images["device"], graphs=True)
    assert torch.equal(_run(images["device"], graphs=False), want)  # the baseline's own graph == eager
    for tier in ("host", "mixed", "nvme", "cold"):
        for graphs in (True, False):
            got = _run(images[tier], graphs)
            assert torch.equal(got, want), f"{tier}, graphs {graphs}: {(got - want).abs().max()}"


def test_the_host_tier_and_the_staging_are_page_locked(images):
    def check(booted, runner):
        off = booted.off_device
        assert off.pinned and "pinned host memory" in off.note()
        # cudaHostRegister'd memory: torch's is_pinned() knows only its own allocator's, the driver maps these
        assert all(device_pointer(chunk.data_ptr()) for chunk in off.host.chunks)
        staging = runner.forward.staging
        assert sorted(staging.sources) == [0, 1]
        assert all(t.is_pinned() for t in staging.host.values())
        assert all(t.is_cuda for t in staging.tables.values())

    _run(images["host"], graphs=True, check=check)


def test_cold_expert_tables_are_read_in_place_from_mapped_host_memory(images):
    def check(booted, runner):
        off = booted.off_device
        table = runner.forward.weights.experts("layers.1").w1.trellis
        host = off.host.raw("layers.1.ffn.experts.w1.trellis")
        assert table.is_cuda and "layers.1.ffn.experts.w1.trellis" not in booted.arena
        assert table.data_ptr() == device_pointer(host.data_ptr())  # the kernels read the host bytes in place
        assert torch.equal(table.reshape(-1).view(torch.uint8).cpu(), host)
        hot = runner.forward.weights.experts("layers.0").w1.trellis.data_ptr()
        assert any(c.data_ptr() <= hot < c.data_ptr() + c.numel() for c in booted.arena.chunks)

    _run(images["cold"], graphs=True, check=check)
