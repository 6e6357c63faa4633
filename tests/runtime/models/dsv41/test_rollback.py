"""Rolling a reference-runner slot back after a verify row: the state is exactly one that never saw the rejected rows.

Slot 0 verifies [last, d1..d5] in one step and keeps m + 1 rows; slot 1 is fed last, d1..dm one token a step.
Both must then hold the same window rings, compressor pending rows, entries and indexer keys, token history,
position and DSpark drafter context (torch.equal), the verify rows' logits must be the single steps' to the
bit, and the next step and the next draft must agree. The tiny model: a 32-token window, ratio-2 compressors
(layers 2, 3), ratio-1 ones (4 to 7), Engram layers 1 and 2, DSpark blocks drafting 5 tokens.
"""

from __future__ import annotations

import pytest
import torch
from tfc.runtime.models.dsv41.reference.runner import StepError
from tfc.runtime.worker.runner import DraftAsk
from tfc.runtime.worker.step import SequenceStep, StepPlan

DRAFT = (17, 240, 3, 99, 512)


@pytest.fixture(scope="module")
def runner(tiny_image):
    from tfc.runtime.options import RuntimeOptions
    from tfc.runtime.worker.worker import Worker

    w = Worker.start(tiny_image, device="cpu", options=RuntimeOptions(graphs=False))
    w.load_model(dtype=torch.float32, slots=2)
    yield w.runner
    w.close()


def _step(runner, slot, tokens, position, verify=False):
    plan = StepPlan((SequenceStep(slot, tuple(tokens), position, verify=verify, drafting=True),))
    return runner.execute(plan).logits[0]


def _both(runner, tokens, position):
    """The same tokens fed to slots 0 and 1 in one step; both logits."""
    rows = tuple(SequenceStep(slot, tuple(tokens), position, drafting=True) for slot in (0, 1))
    return runner.execute(StepPlan(rows)).logits


def _same_state(a, b) -> None:
    assert (a.position, a.tokens) == (b.position, b.tokens)
    assert a.windows.keys() == b.windows.keys() and a.compressors.keys() == b.compressors.keys()
    for layer, ring in a.windows.items():
        assert torch.equal(ring.keys, b.windows[layer].keys), f"window ring of layer {layer}"
    for layer, c in a.compressors.items():
        d = b.compressors[layer]
        assert torch.equal(c.pending_kv, d.pending_kv), f"pending rows of layer {layer}"
        assert (c.pending_gate is None) == (d.pending_gate is None)
        assert c.pending_gate is None or torch.equal(c.pending_gate, d.pending_gate)
        assert c.groups == d.groups and torch.equal(c.entries.view(), d.entries.view())
        assert (c.index_keys is None) == (d.index_keys is None)
        assert c.index_keys is None or torch.equal(c.index_keys.view(), d.index_keys.view())
        assert c.journal is None and d.journal is None


def _same_drafter(a, b) -> None:
    assert (a.state.position, a.state.start, a.waiting) == (b.state.position, b.state.start, b.waiting)
    assert a.state.windows.keys() == b.state.windows.keys()
    for j, ring in a.state.windows.items():
        assert torch.equal(ring.keys, b.state.windows[j].keys)
    assert a.waiting == 0 or torch.equal(torch.cat(a.rows), torch.cat(b.rows))


def test_a_rolled_back_slot_is_one_that_never_saw_the_rejected_rows(runner):
    prompt_len = 30  # verify rows at 30 .. 35: those past 31 overwrite ring slots that still held 0 .. 3
    seed = torch.Generator().manual_seed(prompt_len)
    prompt = torch.randint(0, 640, (prompt_len,), generator=seed).tolist()
    last = 211
    for keep in range(len(DRAFT) + 1):  # m = keep drafts accepted: none, some, all
        for slot in (0, 1):
            runner.release(slot)
        _both(runner, prompt, 0)
        if keep == 1:  # a draft read from the context (and observed it) before the verify: nothing moves
            assert [len(d) for d in runner.draft([DraftAsk(0, last, 5), DraftAsk(1, last, 5)])] == [5, 5]
        rows = _step(runner, 0, (last, *DRAFT), prompt_len, verify=True)
        assert rows.shape == (len(DRAFT) + 1, 640)
        runner.rollback(0, prompt_len + keep + 1)
        serial = [_step(runner, 1, (t,), prompt_len + i) for i, t in enumerate((last, *DRAFT[:keep]))]
        for i, logits in enumerate(serial):
            assert torch.equal(rows[i], logits), f"verify row {i} differs from its single step"
        s0, s1 = runner._states[0], runner._states[1]
        _same_state(s0, s1)
        _same_drafter(runner.drafter.contexts[0], runner.drafter.contexts[1])
        after = prompt_len + keep + 1
        assert torch.equal(*_both(runner, (5,), after))
        assert runner.draft([DraftAsk(0, 9, 5)]) == runner.draft([DraftAsk(1, 9, 5)])
        _same_drafter(runner.drafter.contexts[0], runner.drafter.contexts[1])


def test_a_verify_step_not_rolled_back_is_committed_whole_and_a_snapshot_waits_for_it(runner):
    prompt = list(range(3, 23))
    for slot in (0, 1):
        runner.release(slot)
    _both(runner, prompt, 0)
    _step(runner, 0, (7, 8, 9), 20, verify=True)
    with pytest.raises(StepError, match="not verified"):
        runner.snapshot(0)
    with pytest.raises(StepError, match="cannot go to 24"):
        runner.rollback(0, 24)
    runner.rollback(0, 23)  # keep all: a no-op on the state
    with pytest.raises(StepError, match="no verify step"):
        runner.rollback(0, 23)
    _step(runner, 0, (1, 2), 23, verify=True)
    _step(runner, 0, (4,), 25)  # the next step commits the verify rows
    _step(runner, 1, (7, 8, 9, 1, 2, 4), 20)
    _same_state(runner._states[0], runner._states[1])
    runner.snapshot(0)
    for slot in (0, 1):
        runner.release(slot)
