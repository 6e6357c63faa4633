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


def test_stages_compile_on_cuda_without_the_kernels_unless_switched_off():
    compiled = {"TFC_STAGE_KERNELS": "0"}
    assert fusion.wanted("cuda", compiled) and fusion.wanted("cuda", compiled | {"TFC_COMPILE": "1"})
    assert not fusion.wanted("cuda", compiled | {"TFC_COMPILE": "0"})
    assert not fusion.wanted("cuda", compiled | {"TFC_COMPILE": "off"})
    assert not fusion.wanted("cpu", compiled)


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


def _graphs() -> int:
    import torch._dynamo.utils

    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def test_a_dynamic_dimension_compiles_once_for_every_size(fusion_on):
    @fusion.fused(dynamic={"x": 1})
    def column_sums(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return (x * w[:, None]).sum(0)

    w = torch.arange(1.0, 5.0)
    before = _graphs()
    for width in (16, 32, 48):
        x = torch.ones(4, width)
        assert torch.equal(column_sums(w, x), torch.full((width,), 10.0))
    assert _graphs() - before == 1  # without the dynamic dimension: one graph a width


def test_a_dynamic_parameter_must_exist():
    with pytest.raises(TypeError, match="no parameters"):
        fusion.fused(dynamic={"y": 1})(lambda x: x)


def test_the_indexer_selection_compiles_once_across_context_buckets(fusion_on):
    # a step reaching a new context bucket scores more entries; the selection's compile covers every width (that
    # keeps more blocks than the 4 the candidates take: min(4, blocks) is a guard of its own)
    from tfc.runtime.models.dsv41.fast.compressed import select

    g = torch.Generator().manual_seed(0)
    before = _graphs()
    for width in (1024, 1536, 2048, 4096):
        scores = torch.randn(16, width, generator=g)
        visible = torch.randint(1, width, (16,), generator=g)
        got = select(scores, visible, 64, None, 4, 128, True)
        fusion.enable(False)
        want = select(scores, visible, 64, None, 4, 128, True)
        fusion.enable(True)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert _graphs() - before == 1


@pytest.fixture()
def kernels_restored():
    was = fusion._STATE["kernels"]
    yield
    fusion.use_kernels(was)


def test_a_stage_with_a_kernel_runs_it_where_kernels_run_and_only_there(kernels_restored):
    @fusion.fused(kernel="operator:neg")  # a stand-in kernel with the stage's signature
    def stage(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    x = torch.arange(3.0)
    before = fusion.COUNTS["kernels"]
    fusion.use_kernels("all")
    assert torch.equal(stage(x), -x) and torch.equal(stage(x), -x)
    assert fusion.COUNTS["kernels"] == before + 1  # imported once
    fusion.use_kernels("cuda")  # CPU tensors: the stage as written
    assert torch.equal(stage(x), x + 1)
    fusion.use_kernels("off")
    assert torch.equal(stage(x), x + 1)
    assert stage.stage_kernel == "operator:neg" and stage.stage_fn(x).equal(x + 1)
    with pytest.raises(ValueError, match="'cuda', 'all' or 'off'"):
        fusion.use_kernels("gpu")


def test_stage_kernels_are_the_default_and_leave_nothing_to_compile():
    assert fusion.kernels_wanted({}) and not fusion.kernels_wanted({"TFC_STAGE_KERNELS": "0"})
    assert not fusion.wanted("cuda", {}) and not fusion.wanted("cuda", {"TFC_STAGE_KERNELS": "1"})
    off = {"TFC_STAGE_KERNELS": "0"}
    assert fusion.wanted("cuda", off) and not fusion.wanted("cpu", off)


def test_every_fused_stage_of_the_forward_names_a_kernel_that_exists():
    import importlib

    from tfc.runtime.models.dsv41.fast import attention, compressed, engram, fp32, moe

    stages = {
        name: getattr(m, name)
        for m in (attention, compressed, engram, fp32, moe)
        for name in dir(m)
        if hasattr(getattr(m, name), "stage_fn")
    }
    kernels = {name: run.stage_kernel for name, run in stages.items()}
    assert set(kernels) >= {"attend_rows", "window_rows", "collapse_norm", "hc_mix_logits", "pick", "split3"}
    for name, path in kernels.items():
        if path is None:
            continue
        module, fn = path.split(":")
        assert fn == name and callable(getattr(importlib.import_module(module), fn)), path
