"""TP=N computes TP=1's bits by construction: fixed-point row sums, 128-column blocks, tile-wise decode, shards.

The whole-model checks run the ranks as threads of this process (tests/support/thread_world.py) over the tiny
pack's TP=1, 2 and 4 images: every logit of every step is bit-equal, greedy and seeded. The same through real
processes over gloo is tests/cli/test_generate_tp.py and tests/runtime/server/test_server_tp.py.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from support.thread_world import ThreadWorld
from tfc.compiler.splits import block_parts
from tfc.packs.engram_layout import head_shards
from tfc.runtime.boot.image_open import open_image
from tfc.runtime.engine.generate import generate
from tfc.runtime.engine.sampling import SamplingParams
from tfc.runtime.models.dsv41.reference.numerics import (
    FixedPointRange,
    column_linear,
    fixed_sum,
    from_fixed,
    row_partials,
    to_fixed,
)
from tfc.runtime.models.dsv41.reference.runner import build_reference
from tfc.runtime.models.dsv41.reference.weights import ImageWeights

F64 = torch.float64
PROMPTS = [[0, 297, 315, 522, 363, 331, 265, 317, 518], [0, 634, 404]]
PARAMS = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9, seed=7)]


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def test_fixed_point_sums_are_the_same_in_any_grouping_and_order():
    parts = [_rand(5, 7, seed=s) * 10.0 ** (s % 5 - 2) for s in range(9)]
    whole = fixed_sum(parts)
    for cut in (1, 4, 8):  # two "ranks", each summing its share first, then added
        assert torch.equal(fixed_sum(parts[:cut]) + fixed_sum(parts[cut:]), whole)
    assert torch.equal(fixed_sum(parts[::-1]), whole)
    torch.testing.assert_close(from_fixed(whole), torch.stack(parts).sum(0), rtol=1e-15, atol=1e-18)


def test_fixed_point_refuses_what_it_cannot_hold():
    with pytest.raises(FixedPointRange):
        to_fixed(torch.tensor([2.0**21], dtype=F64))
    with pytest.raises(FixedPointRange):
        to_fixed(torch.tensor([float("nan")], dtype=F64))
    assert torch.equal(
        from_fixed(to_fixed(torch.tensor([-0.75, 3.5], dtype=F64))), torch.tensor([-0.75, 3.5], dtype=F64)
    )


@pytest.mark.parametrize("rows", [1, 3, 17, 64])
def test_block_linears_give_a_rank_split_the_whole_matrix_bits(rows):
    x, w = _rand(rows, 640, seed=1), _rand(640, 640, seed=2)  # 5 blocks: uneven at TP 2 and 4
    whole = column_linear(x, w)
    for world, rank in itertools.chain.from_iterable(((n, r) for r in range(n)) for n in (2, 4)):
        part = block_parts(640, world, "test")[rank]
        assert torch.equal(column_linear(x, w[:, part.start : part.stop]), whole[:, part.start : part.stop])
    total = fixed_sum(row_partials(x, w))
    for world in (2, 4):
        shares = [block_parts(640, world, "test")[r] for r in range(world)]
        ranks = [fixed_sum(row_partials(x[:, p.start : p.stop], w[p.start : p.stop])) for p in shares]
        assert torch.equal(torch.stack(ranks).sum(0), total)


def _weights(image: str, rank: int) -> tuple[ImageWeights, dict]:
    opened = open_image(image, rank)
    return ImageWeights(opened.image, opened.manifest.plan["attrs"], str(opened.path)), opened.manifest.plan[
        "attrs"
    ]


def test_a_rank_decodes_the_bits_of_its_slice_at_tp1(tp_images):
    full, _ = _weights(tp_images[1], 0)
    for world, rank in ((2, 1), (4, 0), (4, 3)):
        mine, attrs = _weights(tp_images[world], rank)
        for name, key in (("head", "head.trellis"), ("layers.2.attn.wq_b", None), ("layers.2.attn.wo_b", None),
                          ("layers.3.ffn.experts.5.w1", "layers.3.ffn.experts.w1.trellis"),
                          ("layers.3.ffn.shared_experts.w2", "layers.3.ffn.experts.w2.trellis")):  # fmt: skip
            a = attrs[key or f"{name}.trellis"]
            lo, hi = a["part"]
            want = full[name][:, lo:hi] if a["split"] == "column" else full[name][lo:hi]
            assert torch.equal(mine[name], want), (world, rank, name)


def _ranks(image: str, world: int, tokens: int = 6) -> list:
    def run(rank, comm):
        runner = build_reference(
            open_image(image, rank), device="cpu", dtype=torch.float32, engram=True, slots=2,
            comm=comm if world > 1 else None,
        )  # fmt: skip
        shard = runner.model.shard
        return shard, generate(runner, PROMPTS, tokens, PARAMS, keep_logits=True)

    return ThreadWorld(world).run(run)


@pytest.fixture(scope="module")
def tp1(tp_images):
    return _ranks(tp_images[1], 1)[0][1]


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_thread_ranks_give_tp1_logits_bit_for_bit(tp_images, tp1, world):
    ranks = _ranks(tp_images[world], world)
    for _, gens in ranks:
        for got, want in zip(gens, tp1, strict=True):
            assert got.tokens == want.tokens and got.token_sha == want.token_sha
            assert torch.equal(torch.stack(got.logits), torch.stack(want.logits))
    shard = ranks[1][0]  # the splits the runtime reads from the image are the compiler's
    cfg = ranks[0][0]
    assert [(p.start, p.stop) for p in block_parts(640, world, "vocab")] == list(shard.vocab)
    assert [(c.start, c.stop) for c in head_shards(12, world)] == list(shard.engram_cols)
    assert shard.world == world and cfg.rank == 0
