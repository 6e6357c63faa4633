"""Tensor-parallel exactness of the EXL3 kernels at DeepSeek-V4.1-Flash shapes on a CUDA GPU (skipped without one).

The rank shares a TP=2 or TP=4 image holds (docs/parallel.md): a row-parallel product (wo_b, the experts' w2) as
fixed-point words that must add up to the whole product's bit for bit, a column-parallel share (wq_b, the head)
launched with the whole product's pinned config that must give the whole product's columns bit for bit. The
value of the words is held to the float64 product at the kernels' own tolerances (test_kernels_gpu.py).
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
from support.exl3_inputs import col_share, cuda_group, row_share

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

SPLITS = {2: (0, 4096, 8192), 4: (0, 2048, 4096, 6144, 8192)}  # wo_b's rows: 8 groups of 1024
INTER_SPLITS = {2: (0, 1152, 2304), 4: (0, 640, 1280, 1792, 2304)}  # 18 blocks of 128 over the ranks


def _shares(n: int, world: int) -> list[tuple[int, int]]:
    """Column spans of `world` ranks over n columns, whole 128-blocks, the first ranks one block more."""
    blocks = n // 128
    sizes = [blocks // world + (r < blocks % world) for r in range(world)]
    edges = [0]
    for s in sizes:
        edges.append(edges[-1] + s * 128)
    return list(itertools.pairwise(edges))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("rows", [1, 4, 16])
def test_row_shares_add_up_to_the_whole_wo_b(rows, world):
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.fixed import fixed_value
    from tfc.kernels.exl3.gemv import exl3_gemm, uses_matrix_units
    from tfc.kernels.exl3.launch import GemmConfig, pinned_config

    k, n = 8192, 5120
    g = cuda_group(k, n, 4, 2, 11)
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    pin = pinned_config(GemmConfig(), rows, g[0].shape[-1], k, n, x.device)
    whole = exl3_gemm(x, *g, config=pin, fixed=True)
    assert torch.equal(whole, exl3_gemm(x, *g, config=pin, fixed=True)), "fixed words must be deterministic"
    edges = SPLITS[world]
    total = sum(
        exl3_gemm(x[:, lo:hi].contiguous(), *row_share(g, lo, hi), config=pin, fixed=True)
        for lo, hi in itertools.pairwise(edges)
    )
    assert torch.equal(total, whole)
    want = x.double() @ exl3_decode(*g, dtype=torch.float32).double()
    err = float((fixed_value(whole).double() - want).norm() / want.norm())
    assert err < (2e-3 if uses_matrix_units(pin, rows, g[0].shape) else 1e-5), err


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize(
    ("k", "n", "rows"), [(1280, 32768, 1), (1280, 32768, 4), (1280, 32768, 16), (5120, 129280, 16)]
)
def test_pinned_column_shares_are_the_whole_products_columns(k, n, rows, world):
    from tfc.kernels.exl3.gemv import exl3_gemm
    from tfc.kernels.exl3.launch import GemmConfig, pinned_config

    g = cuda_group(k, n, 4, 2, 12)
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    pin = pinned_config(GemmConfig(), rows, g[0].shape[-1], k, n, x.device)
    whole = exl3_gemm(x, *g, out_dtype=torch.float32, config=pin)
    for lo, hi in _shares(n, world):
        share = exl3_gemm(x, *col_share(g, lo, hi), out_dtype=torch.float32, config=pin)
        assert torch.equal(share, whole[:, lo:hi]), (lo, hi)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("tokens", [1, 16])
def test_moe_shares_add_up_to_the_whole(tokens, world):
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.expert_table import ExpertTable
    from tfc.kernels.exl3.fixed import fixed_value
    from tfc.kernels.exl3.moe import moe_exl3, moe_reference
    from tfc.runtime.models.dsv41.fast.ops import moe_config

    d, inter, routed, topk, limit = 5120, 2304, 12, 6, 10.0
    groups = [[cuda_group(k, n, 3, 2, 100 * p + e) for e in range(routed + 1)]
              for p, (k, n) in enumerate([(d, inter), (d, inter), (inter, d)])]  # fmt: skip
    x = torch.randn(tokens, d, device="cuda").to(torch.bfloat16)
    ids = torch.stack([torch.randperm(routed)[:topk] for _ in range(tokens)]).cuda()
    wts = torch.rand(tokens, topk, device="cuda") + 0.05

    def tables(lo: int, hi: int):
        w1, w3 = (ExpertTable.build([col_share(g, lo, hi) for g in groups[p]]) for p in (0, 1))
        return SimpleNamespace(w1=w1, w3=w3, w2=ExpertTable.build([row_share(g, lo, hi) for g in groups[2]]))

    config = moe_config(tables(0, inter), topk, x.device, False, inter)  # pinned from the whole width

    def run(lo: int, hi: int) -> torch.Tensor:
        t = tables(lo, hi)
        return moe_exl3(x, ids, wts, t.w1, t.w3, t.w2, swiglu_limit=limit, config=config, fixed=True)

    whole = run(0, inter)
    assert torch.equal(whole, run(0, inter)), "fixed words must be deterministic"
    edges = INTER_SPLITS[world]
    assert torch.equal(sum(run(lo, hi) for lo, hi in itertools.pairwise(edges)), whole)
    dense = [[exl3_decode(*g, dtype=torch.float32) for g in gs] for gs in groups]
    want = moe_reference(x, ids, wts, *dense, swiglu_limit=limit)
    assert float((fixed_value(whole).double() - want).norm() / want.norm()) < 1e-4
