"""The router's split3 and pick and the indexer's select as Triton kernels against the stages, interpreted.

split3 is bit-exact (bf16 and fp16; ties to even, random bit patterns, subnormal parts). pick's expert ids
equal the stage's, deliberate ties in scores + bias going to the lower expert, and its weights lie within 2e-6
relative (the interpreter's softplus is numpy's exp and a log1p made of log, a few ulps from torch's; logits
above 20 are exact both ways, which is how the ties through the bias are made). select equals the stage bit
for bit: ties, -0.0 against +0.0, invisible rows, candidates, fewer columns than k, tl.sort where a Triton has
no tl.topk, and the candidate masks it makes (blocks with nothing real, the newest block pinned, rows not
visible, visible past the row). A row alone gives the bits it gives among others. The stages run as written
(__wrapped__).
"""

from __future__ import annotations

import pytest

RTOL = 2e-6  # pick's weights against torch's
GAP = 1e-5  # scores + bias closer than this may order either way (ulps of softplus apart)


def _split_bits(t):
    import torch

    return t.view(torch.int16)


def _wide_floats(gen, rows, cols):
    """fp32 [rows, cols] of random bits over most exponents (finite; parts down to the subnormals)."""
    import torch

    exp = torch.randint(1, 251, (rows, cols), generator=gen, dtype=torch.int32)
    mant = torch.randint(0, 1 << 23, (rows, cols), generator=gen, dtype=torch.int32)
    sign = torch.randint(0, 2, (rows, cols), generator=gen, dtype=torch.int32) << 31
    return (sign | (exp << 23) | mant).view(torch.float32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize(("rows", "cols"), [(1, 256), (3, 300), (5, 2100)])
def test_split3_is_bit_exact(tk, dtype, rows, cols):
    import torch
    from tfc.runtime.models.dsv41.fast.moe import split3

    dt = getattr(torch, dtype)
    gen = torch.Generator().manual_seed(rows * 7 + cols)
    x = torch.randn(rows, cols, generator=gen) * torch.logspace(-7, 3, cols)
    if dt == torch.bfloat16:  # any finite exponent; fp16 would overflow
        x[:, ::3] = _wide_floats(gen, rows, cols)[:, ::3]
    ulp = 2.0**-7 if dt == torch.bfloat16 else 2.0**-10
    x[0, :4] = torch.tensor(
        [1 + ulp / 2, 1 + 3 * ulp / 2, -(1 + ulp / 2), 1 + ulp / 2 + 2**-20]
    )  # ties to even
    got = tk.router_pick.split3(x, dt)
    want = split3.__wrapped__(x, dt)
    assert got.dtype == dt and got.shape == (3 * rows, cols)
    assert torch.equal(_split_bits(got), _split_bits(want))
    alone = tk.router_pick.split3(x[-1:], dt)
    assert torch.equal(_split_bits(alone), _split_bits(got[rows - 1 :: rows]))


def _logits(gen, rows, experts, split):
    """Products [3R, E] (split) or logits [R, E] with ties: equal columns, and scores + bias equal over 20."""
    import torch

    prod = torch.randn(3 * rows if split else rows, experts, generator=gen) * 2
    bias = torch.randn(experts, generator=gen) * 0.1
    parts = prod.view(3 if split else 1, rows, experts)
    parts[:, :, 5] = parts[:, :, 3]  # column 5 ties column 3 everywhere
    bias[5] = bias[3]
    if rows > 1:  # row 1: exact scores (logits over 20), tied through the bias: 6 + 0 = 5 + 1
        parts[:, 1] = 0.0
        parts[0, 1, :] = 1.0
        parts[0, 1, [2, 4]] = torch.tensor([36.0, 25.0])
        bias[[2, 4]] = torch.tensor([0.0, 1.0])
    if rows > 2:  # row 2: four equal top columns (the boundary of k = 2 cuts through them)
        parts[:, 2, [1, 6, 7]] = parts[:, 2, 0:1] + 3.0
        parts[:, 2, 0] += 3.0
        bias[[1, 6, 7]] = float(bias[0])
    return prod, bias


def check_ids(ids, want, scores_bias, gap=GAP):
    """ids equal want, except that a row may order values of scores + bias closer than gap either way."""
    import torch

    if torch.equal(ids, want):
        return
    got_v, want_v = scores_bias.gather(-1, ids), scores_bias.gather(-1, want)
    assert float((got_v - want_v).abs().max()) < gap, "ids differ beyond near-ties"


@pytest.mark.parametrize("normalise", [True, False])
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize(
    ("experts", "top_k", "rows"), [(8, 2, 3), (8, 6, 1), (384, 6, 5), (256, 8, 2), (384, 1, 2)]
)
def test_pick_matches_the_stage(tk, experts, top_k, rows, split, normalise):
    import torch
    import torch.nn.functional as F
    from tfc.runtime.models.dsv41.fast.moe import pick

    gen = torch.Generator().manual_seed(experts + top_k * 10 + rows * 100 + split * 1000)
    prod, bias = _logits(gen, rows, experts, split)
    got_w, got_ids = tk.router_pick.pick(prod, split, bias, top_k, 2.5, normalise)
    want_w, want_ids = pick.__wrapped__(prod, split, bias, top_k, 2.5, normalise)
    assert got_w.dtype == torch.float32 and got_ids.dtype == torch.int64 and got_ids.shape == (rows, top_k)
    logits = prod.view(3, rows, experts).sum(0) if split else prod
    check_ids(got_ids, want_ids, F.softplus(logits).sqrt() + bias)
    assert torch.equal(got_ids, want_ids)  # these seeds have no near-ties
    assert float(((got_w - want_w).abs() / want_w.abs()).max()) < RTOL
    if rows > 1 and experts == 8:
        assert got_ids[1, :2].tolist() == [2, 4]  # 6.0 at 2 and 4: the lower expert first
    if rows > 2 and experts == 8 and top_k == 2:
        assert got_ids[2].tolist() == [0, 1]
    # a row alone: the same bits
    last = [rows - 1, 2 * rows - 1, 3 * rows - 1] if split else [rows - 1]
    alone_w, alone_ids = tk.router_pick.pick(prod[last], split, bias, top_k, 2.5, normalise)
    assert torch.equal(alone_w, got_w[-1:]) and torch.equal(alone_ids, got_ids[-1:])


def test_pick_and_split3_refuse_what_they_cannot_run(tk):
    import torch

    with pytest.raises(ValueError, match="top_k"):
        tk.router_pick.pick(torch.zeros(2, 4), False, torch.zeros(4), 5, 1.0, True)
    with pytest.raises(ValueError, match="3R"):
        tk.router_pick.pick(torch.zeros(4, 8), True, torch.zeros(8), 2, 1.0, True)
    with pytest.raises(ValueError, match="top_k"):
        tk.router_pick.pick(torch.zeros(1, 2048), False, torch.zeros(2048), 2, 1.0, True)
    with pytest.raises(ValueError, match="bf16 or fp16"):
        tk.router_pick.split3(torch.zeros(2, 4), torch.float32)


def _index_scores(gen, rows, cols):
    """Scores with many exact ties (quarters), -0.0 beside +0.0."""
    import torch

    s = torch.round(torch.randn(rows, cols, generator=gen) * 4) / 4
    s[0, 1::7] = -0.0
    s[0, ::5] = 0.0
    return s


@pytest.mark.parametrize("sort_only", [False, True], ids=["topk", "sort"])
@pytest.mark.parametrize("candidates", [False, True], ids=["plain", "candidates"])
@pytest.mark.parametrize(("cols", "k"), [(70, 16), (40, 64), (200, 48)])
def test_select_matches_the_stage(tk, monkeypatch, cols, k, candidates, sort_only):
    import torch
    from tfc.runtime.models.dsv41.fast.compressed import select

    if sort_only:
        monkeypatch.setattr(tk.router_pick, "HAS_TOPK", False)
    gen = torch.Generator().manual_seed(cols + k)
    rows = 4
    scores = _index_scores(gen, rows, cols)
    visible = torch.tensor([cols, 10, 0, cols + 5], dtype=torch.int32)
    cand = torch.rand(rows, cols, generator=gen) > 0.3 if candidates else None
    order, ok, made = tk.router_pick.select(scores, visible, k, cand, 4, 8, False)
    want = select.__wrapped__(scores, visible, k, cand, 4, 8, False)
    assert made is None and order.dtype == torch.int64 and ok.dtype == torch.bool
    assert torch.equal(order, want[0]) and torch.equal(ok, want[1])
    alone = tk.router_pick.select(scores[:1], visible[:1], k, None if cand is None else cand[:1], 4, 8, False)
    assert torch.equal(alone[0], order[:1]) and torch.equal(alone[1], ok[:1])


@pytest.mark.parametrize(("top_blocks", "block"), [(3, 8), (9, 8), (64, 8), (64, 4), (64, 6), (64, 128)])
def test_select_makes_candidates_with_the_stage(tk, monkeypatch, top_blocks, block):
    # the kernel makes the mask where every block is kept (9 blocks of 8 among 70 columns, or fewer), blocks a
    # power of two wide, one wider than the row; 3 of 9 blocks and blocks of 6 run the stage's torch code
    import torch
    from tfc.runtime.models.dsv41.fast.compressed import select

    makes = top_blocks >= -(-70 // block) and block in (4, 8, 128)
    calls = []
    monkeypatch.setattr(tk.router_pick, "_select_kernel", _counted(tk.router_pick._select_kernel, calls))
    gen = torch.Generator().manual_seed(3)
    scores = _index_scores(gen, 5, 70)
    scores[1, 16:24] = float("-inf")  # a block with no real entry: left out
    scores[1, 32:40] = float("-inf")  # the newest block of row 1 (visible 33), nothing real in it: kept
    scores[3, 64:] = float("-inf")  # the last, partial block
    visible = torch.tensor([70, 33, 0, 66, 75])
    got = tk.router_pick.select(scores, visible, 16, None, top_blocks, block, True)
    want = select.__wrapped__(scores, visible, 16, None, top_blocks, block, True)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert got[2].dtype == torch.bool and bool(calls) == makes
    if makes:
        alone = tk.router_pick.select(scores[1:2], visible[1:2], 16, None, top_blocks, block, True)
        assert torch.equal(alone[2], got[2][1:2]) and torch.equal(alone[0], got[0][1:2])


def _counted(kernel, calls):
    """The launcher `kernel[grid]` with each launch noted in calls."""

    class Counted:
        def __getitem__(self, grid):
            calls.append(grid)
            return kernel[grid]

    return Counted()
