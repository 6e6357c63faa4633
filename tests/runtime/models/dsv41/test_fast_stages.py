"""stages.py on the CPU: a stage runs its Triton kernel where stage kernels run (CUDA tensors; any under the
interpreter's "all") and as written elsewhere; every stage of the forward names a kernel that exists."""

from __future__ import annotations

import pytest
import torch
from tfc.runtime.models.dsv41.fast import stages


@pytest.fixture()
def kernels_restored():
    was = stages._WHERE["kernels"]
    yield
    stages.use_kernels(was)


def test_a_stage_with_a_kernel_runs_it_where_kernels_run_and_only_there(kernels_restored):
    @stages.fused(kernel="operator:neg")  # a stand-in kernel with the stage's signature
    def stage(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    x = torch.arange(3.0)
    stages.use_kernels("cuda")  # the default: CPU tensors run the stage as written
    assert torch.equal(stage(x), x + 1) and stages.kernels_loaded() == 0
    stages.use_kernels("all")
    assert torch.equal(stage(x), -x) and torch.equal(stage(x), -x)
    assert stages.kernels_loaded() == 1  # imported once
    assert stage.stage_kernel == "operator:neg" and stage.stage_fn(x).equal(x + 1)
    assert stages.stage_kernel("operator:neg", x) is not None
    stages.use_kernels("cuda")
    assert stages.stage_kernel("operator:neg", x) is None and stages.kernels_loaded() == 0
    for other in ("off", "gpu"):  # no third way: kernels where they run, the stage as written elsewhere
        with pytest.raises(ValueError, match="'cuda' or 'all'"):
            stages.use_kernels(other)


def test_a_stage_names_its_kernel():
    with pytest.raises(TypeError):
        stages.fused(lambda x: x)  # no kernel: nothing would run it on a GPU


def test_every_fused_stage_of_the_forward_names_a_kernel_that_exists():
    import importlib

    from tfc.runtime.models.dsv41.fast import attention, compressed, engram, fp32, moe

    found = {
        name: getattr(m, name)
        for m in (attention, compressed, engram, fp32, moe)
        for name in dir(m)
        if hasattr(getattr(m, name), "stage_fn")
    }
    kernels = {name: run.stage_kernel for name, run in found.items()}
    assert set(kernels) >= {"attend_rows", "window_rows", "collapse_norm", "hc_mix_logits", "pick", "split3"}
    for name, path in kernels.items():
        module, fn = path.split(":")
        assert fn == name and callable(getattr(importlib.import_module(module), fn)), path
