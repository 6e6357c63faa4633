"""The sampler on GPU logits: the same token as from the same logits on the CPU (its sort runs on the GPU)."""

from __future__ import annotations

import pytest
import torch
from tfc.runtime.engine.sampling import SamplingParams, sample

pytestmark = pytest.mark.gpu

PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.3, top_k=50),
    SamplingParams(temperature=0.9, top_p=0.9),
    SamplingParams(temperature=1.0, min_p=0.05, top_p=0.95),
]


@pytest.mark.parametrize("params", PARAMS, ids=lambda p: f"t{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_gpu_logits_sample_the_cpu_token(params):
    g = torch.Generator().manual_seed(0)
    for draw in range(64):
        # rounded to 1/8: many exact ties, where only a stable sort's order (lower id first) is unique
        logits = (torch.randn(129280, generator=g) * 4).round() / 8
        want = sample(logits, params, 11, draw)
        assert sample(logits.cuda(), params, 11, draw) == want, draw


def test_gpu_rows_drawn_together_are_the_cpu_rows_drawn_alone():
    from tfc.runtime.engine.sampling import sample_rows, sample_rows_on

    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(16, 129280, generator=g) * 4).round() / 8
    params = [PARAMS[i % len(PARAMS)] for i in range(16)]
    for draw in range(8):
        positions = [draw * 16 + i for i in range(16)]
        alone = [sample(logits[i], params[i], 11, positions[i]) for i in range(16)]
        assert sample_rows(logits.cuda(), params, [11] * 16, positions) == alone, draw
        on = sample_rows_on(logits.cuda(), params, [11] * 16, positions)
        assert on.is_cuda and on.tolist() == alone, draw


def test_gpu_penalties_give_the_cpu_values():
    from tfc.runtime.engine.sampling import penalized

    g = torch.Generator().manual_seed(2)
    logits = torch.randn(129280, generator=g) * 4
    history = torch.randint(0, 129280, (4096,), generator=g).tolist()
    params = SamplingParams(temperature=0.8, frequency_penalty=0.5, presence_penalty=-0.3, repetition_penalty=1.2,
                            logit_bias=((5, 3.0), (77, -100.0)))  # fmt: skip
    want = penalized(logits, params, history, 3000)
    assert torch.equal(penalized(logits.cuda(), params, history, 3000).cpu(), want)
