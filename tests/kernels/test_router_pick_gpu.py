"""The router's split3 and pick and the indexer's select kernels at Flash shapes on a CUDA GPU (skipped
without one), against the torch stages run as written on the same GPU.

split3 bit-exact; pick's expert ids equal except between scores + bias closer than 1e-5 (libdevice's expf /
log1pf against torch's, a few ulps at most), its weights within 2e-6 relative; select bit-exact, the candidate
masks it makes too. A row's bits do not depend on the rows beside it (16 against 2048), and the launches replay
in a CUDA graph.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

D, E, K, SCALING = 5120, 384, 6, 2.5
RTOL, GAP = 2e-6, 1e-5


def _x(rows, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(rows, D, device="cuda", generator=gen) * 3


def _prod(rows, split, seed=0):
    """The router's fp32 product: the three bf16 parts (split) or x against a gate like the checkpoint's."""
    from tfc.runtime.models.dsv41.fast.moe import split3

    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    gate = (torch.randn(E, D, device="cuda", generator=gen) * 0.02).to(torch.bfloat16)
    bias = torch.randn(E, device="cuda", generator=gen) * 0.05
    x = _x(rows, seed)
    if split:
        return split3.__wrapped__(x, torch.bfloat16).float() @ gate.float().T, bias
    return x @ gate.float().T, bias


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [16, 2048])
def test_split3_bit_exact_at_flash(rows, dtype):
    from tfc.kernels.dsv41.router_pick import split3 as kernel
    from tfc.runtime.models.dsv41.fast.moe import split3

    x = _x(rows, rows)
    x[0, :3] = torch.tensor([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-11], device="cuda")  # ties to even
    got = kernel(x, dtype)
    want = split3.__wrapped__(x, dtype)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def _check_ids(ids, want, scores_bias):
    if torch.equal(ids, want):
        return
    rows = (ids != want).any(-1)
    near = scores_bias.gather(-1, ids) - scores_bias.gather(-1, want)
    assert float(near.abs().max()) < GAP, "ids differ beyond near-ties"
    assert int(rows.sum()) <= max(2, ids.shape[0] // 100)


@pytest.mark.parametrize("normalise", [True, False])
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("rows", [16, 2048])
def test_pick_at_flash(rows, split, normalise):
    import torch.nn.functional as F
    from tfc.kernels.dsv41.router_pick import pick as kernel
    from tfc.runtime.models.dsv41.fast.moe import pick

    prod, bias = _prod(rows, split)
    bias[7] = bias[3]
    parts = prod.view(3 if split else 1, rows, E)
    parts[:, :, 7] = parts[:, :, 3].clone()  # ties
    w, ids = kernel(prod, split, bias, K, SCALING, normalise)
    want_w, want_ids = pick.__wrapped__(prod, split, bias, K, SCALING, normalise)
    logits = prod.view(3, rows, E).sum(0) if split else prod
    _check_ids(ids, want_ids, F.softplus(logits).sqrt() + bias)
    same = (ids == want_ids).all(-1)
    assert float(((w - want_w).abs() / want_w.abs())[same].max()) < RTOL
    # the first 16 rows alone: the same bits as among 2048 (or 16)
    first = torch.cat([prod[i * rows : i * rows + 16] for i in range(3)]) if split else prod[:16]
    w16, ids16 = kernel(first, split, bias, K, SCALING, normalise)
    assert torch.equal(w16, w[:16]) and torch.equal(ids16, ids[:16])


@pytest.mark.parametrize("rows", [16, 2048])
@pytest.mark.parametrize(("cols", "k"), [(8192, 512), (3000, 512), (300, 512)])
def test_select_at_flash(rows, cols, k):
    from tfc.kernels.dsv41.router_pick import select as kernel
    from tfc.runtime.models.dsv41.fast.compressed import select

    gen = torch.Generator(device="cuda").manual_seed(cols + rows)
    scores = torch.round(torch.randn(rows, cols, device="cuda", generator=gen) * 64) / 64  # many exact ties
    scores[:, ::11] = -0.0
    visible = torch.randint(0, cols + 2, (rows,), device="cuda", generator=gen)
    visible[0] = cols
    for cand in (None, torch.rand(rows, cols, device="cuda", generator=gen) > 0.2):
        order, ok, made = kernel(scores, visible, k, cand, 16, 8, False)
        want = select.__wrapped__(scores, visible, k, cand, 16, 8, False)
        assert made is None and torch.equal(order, want[0]) and torch.equal(ok, want[1])
    alone = kernel(scores[-1:], visible[-1:], k, None, 16, 8, False)
    assert torch.equal(alone[0], kernel(scores, visible, k, None, 16, 8, False)[0][-1:])


@pytest.mark.parametrize("rows", [1, 16, 2048])
@pytest.mark.parametrize("cols", [4096, 16384, 3001])
def test_select_makes_the_candidate_source_mask_at_flash(rows, cols):
    # layer 20's candidates (2048 blocks of 8): made in the kernel, the stage's mask and picks bit for bit
    from tfc.kernels.dsv41.router_pick import select as kernel
    from tfc.runtime.models.dsv41.fast.compressed import select

    gen = torch.Generator(device="cuda").manual_seed(cols + rows)
    scores = torch.round(torch.randn(rows, cols, device="cuda", generator=gen) * 64) / 64
    scores[:, 40:56] = float("-inf")
    visible = torch.randint(0, cols + 9, (rows,), device="cuda", generator=gen)
    visible[0] = cols
    got = kernel(scores, visible, 512, None, 2048, 8, True)
    want = select.__wrapped__(scores, visible, 512, None, 2048, 8, True)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    alone = kernel(scores[-1:], visible[-1:], 512, None, 2048, 8, True)
    assert torch.equal(alone[2], got[2][-1:]) and torch.equal(alone[0], got[0][-1:])


def test_launches_replay_in_a_cuda_graph():
    from tfc.kernels.dsv41.router_pick import pick, select, split3

    x = _x(16, 5)
    prod, bias = _prod(16, True, 5)
    scores = torch.randn(16, 4096, device="cuda")
    visible = torch.full((16,), 4000, device="cuda")

    def step():
        return (
            split3(x, torch.bfloat16),
            *pick(prod, True, bias, K, SCALING, True),
            *select(scores, visible, 512, None, 16, 8, False)[:2],
            *select(scores, visible, 512, None, 2048, 8, True),
        )

    eager = step()  # compiles the kernels before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        held = step()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(held, eager, strict=True))
