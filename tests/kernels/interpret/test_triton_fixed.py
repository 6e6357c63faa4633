"""The EXL3 GEMM and the MoE as fixed-point sums (tensor-parallel exactness) under the CPU interpreter.

A row-parallel product split at a 128-row block into two rank shares must give integer words that add up to the
whole product's, bit for bit, and a column-parallel share launched with the whole product's pinned config must
give exactly the whole product's columns; the value of the words is the product (against the float64
reference). Inputs are random (never zero); outputs are poisoned before every launch.
"""

from __future__ import annotations

from support.exl3_inputs import col_share, random_group, row_share, seeded

K, N, ROWS = 256, 256, 16
D, INTER, ROUTED, TOPK, TOKENS, LIMIT = 128, 256, 2, 1, 1, 0.3


def _group(tk, name: str, k: int, n: int):
    return random_group(tk.exl3_reference, seeded(name), k, n, 32, 2)


def test_gemm_fixed_row_split_adds_up(tk):
    import torch

    (g, dense) = _group(tk, "fixed_gemm", K, N)
    x = torch.randn(ROWS, K)
    gemm = tk.exl3_gemv.exl3_gemm
    whole = gemm(x, *g, fixed=True, out=torch.full((2, ROWS, N), -7, dtype=torch.int64))
    a = gemm(x[:, :128].contiguous(), *row_share(g, 0, 128), fixed=True)
    b = gemm(x[:, 128:].contiguous(), *row_share(g, 128, K), fixed=True)
    assert torch.equal(a + b, whole)
    y = tk.exl3_fixed.fixed_value(whole)
    want = x.double() @ dense.double()
    err = float((y.double() - want).norm() / want.norm())
    assert err < 2e-3, err  # the matrix units round the rotated input to fp16 (rows > 1 in the interpreter)


def test_gemm_pinned_column_share_is_exact(tk):
    import torch

    (g, _) = _group(tk, "fixed_cols", K, N)
    x = torch.randn(ROWS, K)
    gemm, launch = tk.exl3_gemv.exl3_gemm, tk.exl3_launch
    pin = launch.pinned_config(launch.GemmConfig(), ROWS, 32, K, N, x.device)
    whole = gemm(x, *g, out_dtype=torch.float32, config=pin)
    share = gemm(x, *col_share(g, 128, N), out_dtype=torch.float32, config=pin)
    assert torch.equal(share, whole[:, 128:])


def test_fixed_value_matches_the_words():
    import torch
    from tfc.kernels.exl3.fixed import fixed_reference
    from tfc.runtime.models.dsv41.reference.numerics import from_fixed

    p = torch.randn(3, 5) * 100
    words = fixed_reference(p)
    assert torch.equal(from_fixed(words).float(), p)  # one fp32 partial: its words give it back exactly


def test_moe_fixed_split_adds_up(tk):
    import torch

    m, et = tk.moe_exl3, tk.expert_table.ExpertTable
    groups, dense = [], []
    for proj, (k, n) in enumerate([(D, INTER), (D, INTER), (INTER, D)]):
        gs = [_group(tk, f"fixed_moe_{proj}_{e}", k, n) for e in range(ROUTED + 1)]
        groups.append([g for g, _ in gs])
        dense.append([w for _, w in gs])
    x = torch.randn(TOKENS, D).to(torch.float16)
    ids = torch.stack([torch.randperm(ROUTED)[:TOPK] for _ in range(TOKENS)])
    wts = torch.rand(TOKENS, TOPK) + 0.1
    config = m.MoeConfig(split_gate_up=2)  # pinned from the whole width, as ops.moe_config pins it

    def run(lo: int, hi: int):
        w1, w3 = (et.build([col_share(g, lo, hi) for g in groups[p]]) for p in (0, 1))
        w2 = et.build([row_share(g, lo, hi) for g in groups[2]])
        out = torch.full((2, TOKENS, D), -7, dtype=torch.int64)
        return m.moe_exl3(x, ids, wts, w1, w3, w2, swiglu_limit=LIMIT, config=config, out=out, fixed=True)

    whole = run(0, INTER)
    assert torch.equal(run(0, 128) + run(128, INTER), whole)
    want = m.moe_reference(x, ids, wts, *dense, swiglu_limit=LIMIT)
    err = float((tk.exl3_fixed.fixed_value(whole).double() - want).norm() / want.norm())
    assert err < 1e-5, err
