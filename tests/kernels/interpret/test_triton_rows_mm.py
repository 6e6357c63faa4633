"""kernels/rows_mm interpreted against float64: the router's bf16 parts by its gate, the indexer's fp32
`weights_proj`, shapes off the blocks; a row's bits the same alone, among 48 and in a second row block; the router's fp32 input
in one launch as split3's three parts, bit for bit.

Bound: a sum of n products each exact (bf16 by bf16 in fp32) or rounded once (FMA), summed in fp32 in a fixed
order, is within n * 2^-24 * sum |a_k w_k| of the exact sum (recursive summation); n = the k a split range
holds plus the split's partials.
"""

from __future__ import annotations

import pytest
import torch

CASES = [  # (rows, k, n, dtype): the router (3 x 16 parts, D, experts), weights_proj (rows, D, heads), odd shapes
    (48, 5120, 384, torch.bfloat16),
    (16, 5120, 32, torch.float32),
    (3, 1000, 100, torch.bfloat16),
    (5, 64, 17, torch.float32),
]


def _inputs(rows, k, n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=gen).to(dtype), torch.randn(n, k, generator=gen).to(dtype)


@pytest.mark.parametrize(("rows", "k", "n", "dtype"), CASES)
def test_rows_mm_within_the_summation_bound(tk, rows, k, n, dtype):
    a, w = _inputs(rows, k, n, dtype)
    got = tk.rows_mm.rows_mm(a, w)
    want = a.double() @ w.double().t()
    _, split, k_per = tk.rows_mm.plan(k, n)
    bound = (k_per + split) * 2.0**-24 * (a.double().abs() @ w.double().abs().t())
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    assert bool(((got.double() - want).abs() <= bound).all())


def test_rows_mm_splits_the_router_and_leaves_its_counters_zeroed(tk):
    assert tk.rows_mm.plan(5120, 384)[1] > 1 and tk.rows_mm.plan(64, 17)[1] == 1
    a, w = _inputs(4, 1024, 128, torch.bfloat16)
    tk.rows_mm.rows_mm(a, w)
    assert int(tk.exl3_launch.counters(a.device, 1).abs().sum()) == 0


def test_a_rows_bits_depend_on_no_other_row(tk):
    assert tk.rows_mm.plan(1024, 128)[1] == 4
    a, w = _inputs(70, 1024, 128, torch.bfloat16, seed=1)
    full = tk.rows_mm.rows_mm(a, w)
    assert torch.equal(tk.rows_mm.rows_mm(a[5:6], w), full[5:6])
    assert torch.equal(tk.rows_mm.rows_mm(a[66:67], w), full[66:67])  # the second row block
    assert torch.equal(tk.rows_mm.rows_mm(a[:48], w), full[:48])


def test_rows_mm_refuses_mixed_dtypes(tk):
    a, w = _inputs(2, 64, 16, torch.float32)
    with pytest.raises(TypeError, match="one dtype"):
        tk.rows_mm.rows_mm(a, w.bfloat16())


@pytest.mark.parametrize(("rows", "k", "n"), [(16, 5120, 384), (3, 1000, 100)])
def test_the_parts_launch_gives_split3s_three_products_added(tk, rows, k, n):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(rows, k, generator=gen) * torch.exp2(
        torch.randint(-20, 20, (rows, k), generator=gen).float()
    )
    w = torch.randn(n, k, generator=gen).bfloat16()
    prod = tk.rows_mm.rows_mm(tk.router_pick.split3(x, torch.bfloat16), w)
    want = (prod[:rows] + prod[rows : 2 * rows]) + prod[2 * rows :]
    assert torch.equal(tk.rows_mm.rows_mm(x, w, parts=True), want)
    assert torch.equal(tk.rows_mm.rows_mm(x[1:2], w, parts=True), want[1:2])
