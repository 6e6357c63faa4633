"""The whole fast forward with every small-op stage as its Triton kernel (interpreted), against the same forward with
the stages as written, on the tiny image: every kernel takes the forward's real arguments at every layer mode.

One prefill step of 2 tokens through the loose runner (its steps run the live rows only) with small context
buckets, which keeps the interpreter's work small; Engram on, so every stage kernel runs: the 16 are counted.
Tolerance: the step's logits within 1e-5 absolute (their scale is ~2; measured 4.2e-7 over a 40-token run, 4.8e-7
through the exact runner, in one-off runs): fp32 sums in other orders, and now and then an FP8 / FP4 code that a
cached value sits on the rounding midpoint of, as in test_fast_forward.py; the same top-1.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_forward_with_every_stage_kernel_matches_the_stages_as_written(tk, tiny_pack, tmp_path):
    import torch
    from support.dsv41_image import prepared_image
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast import fusion
    from tfc.runtime.models.dsv41.fast.build import build_fast
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    booted = boot(prepared_image(tiny_pack, tmp_path / "store"), device="cpu")
    runner = build_fast(booted, slots=2, tokens_per_slot=128, context_step=64, page_tokens=32, fuse=False,
                        draft=False, exact=False)  # fmt: skip
    plan = StepPlan((SequenceStep(0, (5, 42), 0),))
    got = {}
    try:
        for where in ("off", "all"):
            fusion.use_kernels(where)
            before = fusion.COUNTS["kernels"]
            got[where] = torch.stack(list(runner.execute(plan).logits))
            runner.release(0)
            got[where + "_kernels"] = fusion.COUNTS["kernels"] - before
    finally:
        fusion.use_kernels("off")
        booted.close()
    assert got["off_kernels"] == 0 and got["all_kernels"] == 16
    torch.testing.assert_close(got["all"], got["off"], rtol=0, atol=1e-5)
    assert torch.equal(got["all"].argmax(-1), got["off"].argmax(-1)) and got["off"].std() > 0.1
