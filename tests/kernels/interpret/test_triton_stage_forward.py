"""The whole fast forward with every small-op stage as its Triton kernel (interpreted), against the same forward with
the stages as written, on the tiny image: every kernel takes the forward's real arguments at every layer mode; and
with the kernels the exact runner keeps a row's bits whatever its chunking, slot and neighbours.

One prefill step of 2 tokens through the loose runner (its steps run the live rows only) with small context
buckets, which keeps the interpreter's work small; Engram on, so every stage kernel runs: the 19 are counted.
Tolerance: the step's logits within 1e-5 absolute (their scale is ~2; measured 4.2e-7 over a 40-token run, 4.8e-7
through the exact runner, in one-off runs): fp32 sums in other orders, and now and then an FP8 / FP4 code that a
cached value sits on the rounding midpoint of, as in test_fast_forward.py; the same top-1.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def image(tiny_pack, tmp_path_factory):
    """The tiny pack's prepared TP=1 image with its Engram tables."""
    from support.dsv41_image import prepared_image

    return prepared_image(tiny_pack, tmp_path_factory.mktemp("img"))


def _runner(image, exact: bool):
    """(booted, a fast runner of 3 slots with small context buckets) on the CPU."""
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast.build import build_fast

    booted = boot(image, device="cpu")
    return booted, build_fast(booted, slots=3, tokens_per_slot=128, context_step=64, page_tokens=32, draft=False,
                              exact=exact)  # fmt: skip


def test_the_forward_with_every_stage_kernel_matches_the_stages_as_written(tk, image):
    import torch
    from tfc.runtime.models.dsv41.fast import stages
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    booted, runner = _runner(image, exact=False)
    plan = StepPlan((SequenceStep(0, (5, 42), 0),))
    got = {}
    try:
        for where in ("cuda", "all"):  # CPU tensors: the stages as written, then every kernel interpreted
            stages.use_kernels(where)
            got[where] = torch.stack(list(runner.execute(plan).logits))
            runner.release(0)
            got[where + "_kernels"] = stages.kernels_loaded()
    finally:
        stages.use_kernels("cuda")
        booted.close()
    assert got["cuda_kernels"] == 0 and got["all_kernels"] == 19
    torch.testing.assert_close(got["all"], got["cuda"], rtol=0, atol=1e-5)
    assert torch.equal(got["all"].argmax(-1), got["cuda"].argmax(-1)) and got["cuda"].std() > 0.1


def test_with_the_stage_kernels_a_prompt_chunked_beside_another_keeps_its_bits(tk, image):
    import torch
    from tfc.runtime.models.dsv41.fast import stages
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    booted, runner = _runner(image, exact=True)
    toks, other = [(37 * i + 5) % 600 for i in range(6)], [(11 * i + 3) % 600 for i in range(3)]
    stages.use_kernels("all")
    try:
        first = StepPlan((SequenceStep(0, tuple(toks), 0), SequenceStep(1, tuple(toks[:2]), 0)))
        whole = runner.execute(first).logits[0]
        rest = StepPlan((SequenceStep(1, tuple(toks[2:]), 2), SequenceStep(2, tuple(other), 0)))
        chunked = runner.execute(rest).logits[0]
    finally:
        stages.use_kernels("cuda")
        booted.close()
    assert torch.equal(whole, chunked)  # another chunking, another slot, a neighbour in the step
