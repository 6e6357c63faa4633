"""The fused-stage switch (fusion.py) on the CPU: when it is on, where it is off, and a stage that cannot compile."""

from __future__ import annotations

import pytest
import torch
from tfc.runtime.models.dsv41.fast import fusion


@pytest.fixture()
def fusion_on():
    fusion.enable(True)
    yield
    fusion.enable(False)


def test_stages_compile_on_cuda_unless_switched_off():
    assert fusion.wanted("cuda", {}) and fusion.wanted("cuda", {"TFC_COMPILE": "1"})
    assert not fusion.wanted("cuda", {"TFC_COMPILE": "0"}) and not fusion.wanted(
        "cuda", {"TFC_COMPILE": "off"}
    )
    assert not fusion.wanted("cpu", {})


def test_a_stage_dynamo_cannot_take_runs_eagerly_and_says_so(fusion_on):
    @fusion.fused
    def host_read(x: torch.Tensor) -> torch.Tensor:
        return x * len(x.tolist())  # a host read: no whole graph

    before = len(fusion.NOTES)
    x = torch.arange(3.0)
    assert torch.equal(host_read(x), x * 3) and torch.equal(host_read(x), x * 3)
    assert len(fusion.NOTES) == before + 1 and "host_read runs eagerly" in fusion.NOTES[-1]


def test_stages_run_as_written_while_off():
    calls = []

    @fusion.fused
    def stage(x: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        return x + 1

    assert torch.equal(stage(torch.zeros(2)), torch.ones(2)) and calls == [1]


def test_a_compiled_stage_rounds_at_its_casts_like_eager(fusion_on):
    # the router's split of x into three bf16 parts: fused without emulated casts, hi.float() stays x, mid and lo
    # come out zero and the parts sum to bf16(x) (7.8e-3 off on this input)
    from tfc.runtime.models.dsv41.fast.moe import split3

    x = torch.randn(16, 512, generator=torch.Generator().manual_seed(0))
    parts = split3(x, torch.bfloat16).float()
    assert torch.equal((parts[:16] + parts[16:32]) + parts[32:], x)
