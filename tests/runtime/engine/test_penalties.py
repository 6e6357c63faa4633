"""Logit bias and repetition / frequency / presence penalties (sampling.penalized) against a plain loop, and
their place before the draw: a row's penalized draw does not depend on the rows beside it."""

from __future__ import annotations

import pytest
import torch
from tfc.runtime.engine.sampling import SamplingError, SamplingParams, penalized, sample, sample_rows


def _loop(logits: list[float], p: SamplingParams, before: list[int], prompt_len: int) -> list[float]:
    """vLLM's order, one token at a time: bias, repetition over prompt and output, frequency and presence over
    the output."""
    out = list(logits)
    for t, b in p.logit_bias:
        out[t] += b
    for t in set(before):
        out[t] = out[t] / p.repetition_penalty if out[t] > 0 else out[t] * p.repetition_penalty
    output = before[prompt_len:]
    for t in set(output):
        out[t] -= p.frequency_penalty * output.count(t) + p.presence_penalty
    return out


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(frequency_penalty=0.75, presence_penalty=-0.5),
        SamplingParams(repetition_penalty=1.7),
        SamplingParams(repetition_penalty=0.6, frequency_penalty=-1.25, logit_bias=((3, 5.5), (9, -100.0))),
    ],
)
def test_penalized_matches_a_plain_loop(params):
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(16, generator=gen, dtype=torch.float64) * 3
    before = [1, 2, 2, 5, 9, 3, 3, 3, 7, 2]  # a 4-id prompt, then the output
    got = penalized(logits, params, before, 4)
    want = torch.tensor(_loop(logits.tolist(), params, before, 4), dtype=torch.float64)
    assert torch.equal(got, want)
    assert torch.equal(penalized(logits, SamplingParams(), before, 4), logits)  # nothing set: the logits


def test_prompt_ids_count_for_repetition_only():
    logits = torch.full((8,), 2.0, dtype=torch.float64)
    p = SamplingParams(frequency_penalty=1.0, presence_penalty=1.0, repetition_penalty=2.0)
    got = penalized(logits, p, [4, 4, 4, 6], 3)  # 4 only in the prompt, 6 once in the output
    assert got[4] == 1.0 and got[6] == 1.0 - 2.0 and got[0] == 2.0


def test_a_penalized_row_draws_what_it_draws_alone():
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 64, generator=gen, dtype=torch.float64)
    params = [SamplingParams(temperature=0.9, top_p=0.9, frequency_penalty=1.0), SamplingParams(temperature=1.1),
              SamplingParams(temperature=0.7, repetition_penalty=1.4, logit_bias=((5, 2.0),))]  # fmt: skip
    rows = torch.stack([penalized(x, p, [5, 6, 6, 7], 1) for x, p in zip(logits, params, strict=True)])
    batched = sample_rows(rows, params, [11, 12, 13], [40, 40, 40])
    assert batched == [sample(rows[i], params[i], 11 + i, 40) for i in range(3)]


@pytest.mark.parametrize(
    "kw",
    [{"presence_penalty": 2.5}, {"frequency_penalty": -2.1}, {"repetition_penalty": 0.0},
     {"repetition_penalty": 11.0}, {"logit_bias": ((3, 101.0),)}, {"logit_bias": ((-1, 1.0),)}],
)  # fmt: skip
def test_bad_penalties_are_refused(kw):
    with pytest.raises(SamplingError):
        SamplingParams(**kw)


def test_a_bias_past_the_vocabulary_is_refused():
    with pytest.raises(SamplingError, match="vocabulary"):
        penalized(torch.zeros(8), SamplingParams(logit_bias=((8, 1.0),)), [], 0)


def test_generate_refuses_penalties_it_would_not_apply():
    from types import SimpleNamespace

    from tfc.runtime.engine.generate import generate

    runner = SimpleNamespace(capacity=SimpleNamespace(slots=4))
    with pytest.raises(SamplingError, match="engine"):
        generate(runner, [[1]], 2, SamplingParams(presence_penalty=1.0))
