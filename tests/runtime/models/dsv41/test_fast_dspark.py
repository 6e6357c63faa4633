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
