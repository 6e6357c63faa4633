"""The MoE's pairs ordered and grouped by expert (kernels/exl3/moe_order.py) against torch, and the grouped MoE's
batch invariance: a step of tokens whose pairs share experts (groups of 1-4 pairs, several groups an expert) gives
every token the bits it gets alone (one token: unsorted, a pair a program), under the CPU interpreter (see
conftest.py)."""

from __future__ import annotations

import pytest
from test_triton_moe import LIMIT, TOPK, D, moe_inputs


@pytest.mark.parametrize(("tokens", "topk", "routed"), [(2, 2, 4), (9, 6, 8), (40, 3, 5), (70, 6, 384)])
def test_pairs_are_ordered_and_grouped_by_expert(tk, tokens, topk, routed):
    import torch

    gen = torch.Generator().manual_seed(tokens)
    ids = torch.stack([torch.randperm(routed, generator=gen)[:topk] for _ in range(tokens)]).int()
    got = tk.moe_order.order_pairs(ids, routed)
    order, end, leaders = tk.moe_order.order_reference(ids, routed)
    n = int(got.nleaders[0])
    assert got.order.tolist() == order and got.end.tolist() == end
    assert got.leaders[:n].tolist() == leaders and n <= got.bound
    assert tk.moe_order.order_pairs(ids[:1], routed) is None  # one token: its pairs never share an entry


def test_grouped_moe_rows_do_not_depend_on_their_neighbours(tk):
    import torch

    tables, _, _, _, _, _ = moe_inputs(tk, "stack")
    tokens = 6
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, D, generator=gen).to(torch.float16)
    # experts 0 and 1 picked 4 times each (a full group), the shared expert 6 (a full group and a partial one)
    ids = torch.stack(
        [torch.tensor([t % 2, 2 + t % 2]) if t % 3 else torch.tensor([0, 1]) for t in range(tokens)]
    )
    wts = torch.rand(tokens, TOPK, generator=gen) + 0.1
    m = tk.moe_exl3
    config = m.MoeConfig(runs=False, block_k=16, split_gate_up=3, split_down=2)
    together = m.moe_exl3(x, ids, wts, *tables, swiglu_limit=LIMIT, config=config, out_dtype=torch.float32)
    for t in (0, 5):
        alone = m.moe_exl3(x[t : t + 1], ids[t : t + 1], wts[t : t + 1], *tables, swiglu_limit=LIMIT, config=config,
                           out_dtype=torch.float32)  # fmt: skip
        assert torch.equal(together[t : t + 1], alone), t
