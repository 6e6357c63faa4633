"""The one-launch Sinkhorn of the mHC mix against the model's own loop (mhc.hc_mix) in float64, interpreted.

Tolerance 2e-6 absolute on entries in [0, 1]: fp32 softmax and 20 rounds of fp32 divisions by sums of four
values, each rounding within an ulp (6e-8) of the float64 result, the errors not growing (each round renormalises).
"""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("rows", "iters"), [(1, 20), (16, 20), (37, 3), (5, 1)])
def test_sinkhorn_kernel_matches_the_models_loop(tk, rows, iters):
    import torch
    from tfc.runtime.models.dsv41.reference.mhc import sinkhorn

    gen = torch.Generator().manual_seed(rows * 100 + iters)
    logits = torch.randn(rows, 4, 4, generator=gen) * 3
    got = tk.mhc_sinkhorn.sinkhorn(logits, iters, 1e-6)
    want = sinkhorn(logits.double(), iters, 1e-6)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    assert float((got.double() - want).abs().max()) < 2e-6


def test_sinkhorn_refuses_a_matrix_it_cannot_hold(tk):
    import torch

    with pytest.raises(ValueError, match="power of two"):
        tk.mhc_sinkhorn.sinkhorn(torch.zeros(2, 3, 3), 20, 1e-6)
