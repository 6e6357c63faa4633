"""kernels/rows_mm on a CUDA GPU (skipped without one): the router's bf16 parts by its gate on the matrix units and
the indexer's fp32 `weights_proj` by FMA, each within the summation bound of float64 (test_triton_rows_mm.py
says which); a row's bits the same alone, among 48 and in a second row block; the router's parts in one launch
equal to split3, the product and the sum of the parts; the launch replays in a graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu


@pytest.fixture
def rows_mm():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from tfc.kernels import rows_mm

    return rows_mm


def _inputs(rows, k, n, dtype, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(rows, k, device="cuda", generator=gen).to(dtype),
            torch.randn(n, k, device="cuda", generator=gen).to(dtype))  # fmt: skip


@pytest.mark.parametrize(("rows", "k", "n", "dtype"),
                         [(48, 5120, 384, torch.bfloat16), (16, 5120, 32, torch.float32), (3, 1000, 100, torch.bfloat16)])  # fmt: skip
def test_rows_mm_within_the_summation_bound_on_the_gpu(rows_mm, rows, k, n, dtype):
    a, w = _inputs(rows, k, n, dtype)
    got = rows_mm.rows_mm(a, w)
    _, split, k_per = rows_mm.plan(k, n)
    bound = (k_per + split) * 2.0**-24 * (a.double().abs() @ w.double().abs().t())
    assert bool(((got.double() - a.double() @ w.double().t()).abs() <= bound).all())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_rows_bits_depend_on_no_other_row_on_the_gpu(rows_mm, dtype):
    a, w = _inputs(70, 5120, 384, dtype, seed=1)
    full = rows_mm.rows_mm(a, w)
    for lo, hi in ((5, 6), (66, 67), (0, 16), (0, 48)):
        assert torch.equal(rows_mm.rows_mm(a[lo:hi], w), full[lo:hi])


def test_rows_mm_replays_in_a_cuda_graph(rows_mm):
    a, w = _inputs(48, 5120, 384, torch.bfloat16)
    other = _inputs(48, 5120, 384, torch.bfloat16, seed=2)[0]
    rows_mm.rows_mm(a, w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = rows_mm.rows_mm(a, w)
    a.copy_(other)
    for _ in range(3):  # the counters left zeroed by each replay
        graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, rows_mm.rows_mm(other, w))


@pytest.mark.parametrize("rows", [1, 16])
def test_the_parts_launch_gives_split3s_three_products_added_on_the_gpu(rows_mm, rows):
    from tfc.kernels.router_pick import split3

    gen = torch.Generator(device="cuda").manual_seed(rows)
    x = torch.randn(rows, 5120, device="cuda", generator=gen)
    w = torch.randn(384, 5120, device="cuda", generator=gen).bfloat16()
    prod = rows_mm.rows_mm(split3(x, torch.bfloat16), w)
    want = (prod[:rows] + prod[rows : 2 * rows]) + prod[2 * rows :]
    assert torch.equal(rows_mm.rows_mm(x, w, parts=True), want)
