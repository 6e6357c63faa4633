"""The fast DSpark drafter (CPU, tiny image) against the reference DsparkDrafter: the same proposals.

Both read the same target hidden rows (the reference forward's capture); the fast one runs the blocks' EXL3
groups and expert tables from the arena through the fast forward's ops in fp32, the reference dense and
float64-wide. Over rounds observed in pieces, greedy and with a sampler's pick, the tokens are the same and the
logits, parallel logits and confidence agree to fp32 rounding.
"""

from __future__ import annotations

import pytest
import torch
from support.dsv41_image import prepared_image
from tfc.runtime.boot.rank import boot
from tfc.runtime.models.dsv41.dspark.drafter import DraftError
from tfc.runtime.models.dsv41.dspark.fast import FastDsparkDrafter
from tfc.runtime.models.dsv41.fast.build import build_fast

pytestmark = pytest.mark.slow

TOKENS = torch.randint(3, 640, (70,), generator=torch.Generator().manual_seed(2)).tolist()


@pytest.fixture(scope="module")
def pair(tiny_pack, tmp_path_factory):
    """(the fast drafter, the reference drafter, the reference's target hidden rows of TOKENS)."""
    from tfc.runtime.models.dsv41.reference.runner import build_reference

    booted = boot(prepared_image(tiny_pack, tmp_path_factory.mktemp("img")), device="cpu")
    fast = build_fast(booted, slots=1, tokens_per_slot=512, context_step=256, page_tokens=32, draft=False)
    ref = build_reference(booted.image, device="cpu", dtype=torch.float32, engram=True, slots=1)
    drafter = ref.drafter.drafter
    state = ref.model.new_state()
    _, hidden = ref.model.forward(
        [TOKENS], [state], [ref.feed.rows([], TOKENS)], capture=drafter.target_layers
    )
    yield FastDsparkDrafter(fast.forward), drafter, hidden[0]
    booted.close()


def _close(got, want) -> None:
    assert got.tokens == want.tokens
    for a, b in ((got.logits, want.logits), (got.base, want.base), (got.confidence, want.confidence)):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), float((a - b).abs().max())


def second_best(logits: torch.Tensor) -> int:
    return int(torch.topk(logits, 2).indices[1])


def test_fast_drafts_are_the_reference_drafts_over_rounds(pair):
    fast, ref, hidden = pair
    mine, theirs = fast.new_state(), ref.new_state()
    # observed in pieces: a prefill past the window, one committed row, a verify step's three, the rest
    for cut, anchor, choose in ((40, 5, None), (41, 300, None), (44, 77, second_best), (70, 9, None)):
        kw = {} if choose is None else {"choose": choose}
        lo = mine.position
        _close(
            fast.draft(mine, hidden[lo:cut], anchor, **kw), ref.draft(theirs, hidden[lo:cut], anchor, **kw)
        )
        assert mine.position == theirs.position == cut
    short = fast.draft(mine, hidden[:0], 9, k=2)
    assert short.tokens == ref.draft(theirs, hidden[:0], 9, k=2).tokens and short.logits.shape == (2, 640)


def test_a_resumed_state_drafts_from_its_own_rows(pair):
    fast, ref, hidden = pair
    mine, theirs = fast.new_state(), ref.new_state()
    mine.position = mine.start = theirs.position = theirs.start = 50  # a slot restored at 50: no rings before
    _close(fast.draft(mine, hidden[50:60], 12), ref.draft(theirs, hidden[50:60], 12))


def test_bad_draft_requests_are_refused(pair):
    fast, _, hidden = pair
    with pytest.raises(DraftError, match="drafts 1 to 5"):
        fast.draft(fast.new_state(), hidden, 3, k=6)
    with pytest.raises(DraftError, match="nothing observed"):
        fast.draft(fast.new_state(), hidden[:0], 3)
    with pytest.raises(DraftError, match="target hidden"):
        fast.draft(fast.new_state(), hidden[:, :10], 3)


def test_sequences_drafted_together_draft_what_each_drafts_alone(pair):
    from tfc.runtime.models.dsv41.dspark.drafter import DraftInput, greedy

    fast, ref, hidden = pair
    # (first position observed, last observed, anchor, k): a fresh context, one past the window, a resumed one, a short k
    asks = ((0, 30, 5, None), (0, 70, 300, None), (50, 61, 77, 3), (0, 12, 9, 2), (10, 45, 1, None))
    picks = [greedy, second_best, greedy, second_best, greedy]  # each sequence its own sampler
    alone, theirs = [], []
    for (lo, hi, anchor, k), pick in zip(asks, picks, strict=True):
        mine, ref_state = fast.new_state(), ref.new_state()
        mine.position = mine.start = ref_state.position = ref_state.start = lo
        alone.append(fast.draft(mine, hidden[lo:hi], anchor, k, pick))
        theirs.append(ref.draft(ref_state, hidden[lo:hi], anchor, k, pick))
    states = [fast.new_state() for _ in asks]
    for state, (lo, *_) in zip(states, asks, strict=True):
        state.position = state.start = lo
    inputs = [
        DraftInput(s, hidden[lo:hi], anchor, k) for s, (lo, hi, anchor, k) in zip(states, asks, strict=True)
    ]
    together = fast.draft_many(
        inputs, lambda i, logits, which: [picks[s](row) for row, s in zip(logits, which, strict=True)]
    )
    for got, solo, want, state, (_, hi, *_) in zip(together, alone, theirs, states, asks, strict=True):
        assert got.tokens == solo.tokens and state.position == hi
        # the blocks run all sequences' rows in one product, whose sums the row count may order otherwise
        # (measured 2.6e-8 on logits of ~0.03 and 4.8e-7 on confidences of ~2: fp32 rounding)
        for a, b in ((got.logits, solo.logits), (got.base, solo.base), (got.confidence, solo.confidence)):
            torch.testing.assert_close(a, b, rtol=0, atol=2e-6)
        _close(got, want)
