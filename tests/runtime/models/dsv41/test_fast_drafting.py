"""Drafting on the fast runner (CPU, tiny image): verify rows, rollback == never fed, hidden capture, the engine.

A slot fed a verify row and rolled back must be the slot of a sequence never fed the rejected rows: the logits
of the tokens that follow bit for bit, and every KV row a later read can reach byte for byte (window rows of
positions inside the window, compressor rows of the pending group, entries and index keys of complete
groups, the pages it holds); rollbacks inside a ratio-2 group, across group boundaries, at the ring's wrap and
across a page (window 32, pages of 32 tokens). Through the engine, drafted == serial by token_sha, greedy and
seeded, solo and at once, with a scripted drafter (accepting none, some or all of a round) and the DSpark one
(the fast drafter, whose drafts on the fast runner are the reference runner's with the reference drafter).
TFC_TEST_FAST_DEVICE=cuda runs the same on a GPU with graphs on; the two
comparisons with the CPU reference runner stay on the CPU (the GPU forward rounds activations: test_fast_gpu.py
bounds that).
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from support.dsv41_image import prepared_image
from support.scripted_drafter import Scripted
from support.slot_drafters import OneAtATime
from tfc.runtime.boot.rank import boot
from tfc.runtime.models.dsv41.fast.build import build_fast
from tfc.runtime.models.dsv41.fast.kv.snapshot import entry_rows
from tfc.runtime.models.dsv41.fast.runner import FastStepError
from tfc.runtime.options import RuntimeOptions
from tfc.runtime.worker.runner import DraftAsk, drafter_of
from tfc.runtime.worker.step import SequenceStep, StepPlan

from tfc import settings

DEVICE = settings.get("TFC_TEST_FAST_DEVICE")
ON_CPU_ONLY = pytest.mark.skipif(DEVICE != "cpu", reason="against the CPU reference runner's bits: CPU only")

VOCAB = 640
PROMPT = torch.randint(3, VOCAB, (72,), generator=torch.Generator().manual_seed(11)).tolist()
VERIFY = [17, 402, 9, 555, 230, 61]  # the last token and five drafts
TAIL = [7, 300, 21]


@pytest.fixture(scope="module")
def fast(tiny_pack, tmp_path_factory):
    """A fast runner of 6 slots on DEVICE's arena (graphs on a GPU), pages of 32 tokens, with its DSpark drafter
    kept as `dspark`."""
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("TFC_TEST_FAST_DEVICE=cuda without CUDA")
    image = prepared_image(tiny_pack, tmp_path_factory.mktemp("img"))
    booted = boot(image, device=DEVICE, options=RuntimeOptions(graphs=DEVICE == "cuda"))
    runner = build_fast(booted, slots=6, tokens_per_slot=512, context_step=256, page_tokens=32)
    runner.dspark = runner.drafter
    yield runner
    booted.close()


@pytest.fixture
def fresh(fast):
    """The runner with every slot released after the test (and its DSpark drafter back)."""
    yield fast
    for slot in range(fast.capacity.slots):
        fast.release(slot)
    fast.drafter = fast.dspark
    assert fast.kv.pool.free_pages == fast.kv.pool.pages


def _step(runner, slot: int, tokens, position: int, **kw) -> torch.Tensor:
    return runner.execute(StepPlan((SequenceStep(slot, tuple(tokens), position, **kw),))).logits[0]


def _feed(runner, slot: int, tokens, start: int) -> list[torch.Tensor]:
    """Each token's logits, fed one a step from `start`."""
    return [_step(runner, slot, (t,), start + i) for i, t in enumerate(tokens)]


def _reachable(runner, slot: int) -> dict[str, torch.Tensor]:
    """Every KV row of a slot that a read from its position on can reach, and its pages and tokens."""
    kv, q = runner.kv, runner._slots[slot].position
    lay = kv.layout
    seen = torch.arange(max(0, q - lay.window + 1), q)
    out = {"window": kv.window[:, slot, seen % lay.ring], "pages": torch.tensor(len(kv.pool.table(slot))),
           "tokens": torch.tensor(list(runner._slots[slot].tokens))}  # fmt: skip
    for s in lay.sources:
        rows = entry_rows(kv, slot, s.ratio, q // s.ratio)
        out[f"entries.{s.layer}"] = kv.entries[s.layer][rows]
        if s.index_keys:
            out[f"keys.{s.layer}"] = kv.keys[s.layer][rows]
        if s.ratio > 1:
            pending = torch.arange(q // s.ratio * s.ratio, q)
            out[f"pending.{s.layer}"] = kv.pending[s.layer][:, slot, pending % kv.pending[s.layer].shape[2]]
    return out


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


# (verify position p, rows kept): inside a ratio-2 group (q odd: one row of the group pending), across group
# boundaries, rejected rows wrapping the 48-row ring (positions 48+ over 0..), across the page at 64, all kept
CASES = [(20, 1), (21, 4), (45, 2), (62, 1), (60, 6)]


@pytest.mark.slow
@pytest.mark.parametrize(("p", "keep"), CASES)
def test_a_rolled_back_slot_is_a_slot_never_fed_the_rejected_rows(fresh, p, keep):
    fast, q = fresh, p + keep
    _step(fast, 0, PROMPT[:p], 0)
    rows = _step(fast, 0, VERIFY, p, verify=True)
    assert rows.shape == (len(VERIFY), VOCAB)
    fast.rollback(0, q)
    want = fast.logits_of(1, PROMPT[:p] + VERIFY[:keep], 0)  # never fed the rest
    assert torch.equal(rows[:keep], want[p:])  # the kept rows' logits are the serial ones
    _same(_reachable(fast, 0), _reachable(fast, 1))
    got, ref = _feed(fast, 0, TAIL, q), _feed(fast, 1, TAIL, q)
    assert all(torch.equal(a, b) for a, b in zip(got, ref, strict=True))
    _same(_reachable(fast, 0), _reachable(fast, 1))


def test_a_verify_step_not_rolled_back_is_committed_whole(fresh):
    fast = fresh
    _step(fast, 0, PROMPT[:30], 0)
    _step(fast, 0, VERIFY, 30, verify=True)
    with pytest.raises(FastStepError, match="not verified yet"):
        fast.snapshot(0)
    got = _feed(fast, 0, TAIL[:1], 36)  # the next call, no rollback
    want = fast.logits_of(1, PROMPT[:30] + VERIFY + TAIL[:1], 0)[-1]
    assert torch.equal(got[0], want)
    with pytest.raises(FastStepError, match="no verify step"):
        fast.rollback(0, 36)


def test_verify_rows_are_checked(fresh):
    fast = fresh
    assert drafter_of(fast) is fast and fast.draft_block == 5
    with pytest.raises(FastStepError, match="verify row"):
        _step(fast, 0, VERIFY, 0, verify=True)  # at position 0
    _step(fast, 0, PROMPT[:10], 0)
    with pytest.raises(FastStepError, match="verify row"):
        _step(fast, 0, [*VERIFY, 3], 10, verify=True)  # seven rows
    _step(fast, 0, VERIFY, 10, verify=True)
    for bad in (9, 17):
        with pytest.raises(FastStepError, match="cannot go back"):
            fast.rollback(0, bad)


class Recorder(OneAtATime):
    """A drafter that keeps the rows it is committed (and proposes nothing)."""

    block_size = 5

    def __init__(self, layers: tuple[int, ...]) -> None:
        self.target_layers = layers
        self.rows: dict[int, torch.Tensor] = {}

    def commit(self, slot, position, hidden) -> None:
        assert position == sum(r.shape[0] for r in self.rows.values())
        self.rows[position] = hidden

    def propose_one(self, slot, tokens, last_token, k) -> tuple[int, ...]:
        return ()

    def release(self, slot) -> None:
        pass


@pytest.fixture(scope="module")
def reference(fast):
    """The reference runner over the same image (Engram on), with its DSpark drafter."""
    from tfc.runtime.models.dsv41.reference.runner import build_reference

    image = fast.forward.weights.image
    return build_reference(image, device="cpu", dtype=torch.float32, engram=True, slots=1)


@ON_CPU_ONLY
@pytest.mark.slow
def test_hidden_rows_reach_the_drafter_once_committed_and_match_the_reference(fresh, reference):
    fast, ref = fresh, reference
    layers = fast.forward.capture
    assert layers == (5, 6, 7) and any(t is fast.forward.buffers.hidden for t in fast.forward.buffers.tensors)
    rec = fast.drafter = Recorder(layers)
    _step(fast, 0, PROMPT[:20], 0, drafting=True)
    _step(fast, 0, VERIFY, 20, verify=True, drafting=True)
    assert sorted(rec.rows) == [0]  # the verify rows wait for the engine's word
    fast.rollback(0, 23)
    _step(fast, 0, [5], 23, drafting=True)
    _step(fast, 1, PROMPT[:4], 0)  # not drafting: nothing committed
    assert sorted(rec.rows) == [0, 20, 23]
    hidden = torch.cat([rec.rows[k] for k in sorted(rec.rows)])
    tokens = PROMPT[:20] + VERIFY[:3] + [5]
    _, want = ref.model.forward(
        [tokens], [ref.model.new_state()], [ref.feed.rows([], tokens)], capture=layers
    )
    assert hidden.shape == want[0].shape == (24, 3 * 256)
    # the fp32 residual streams' bound of test_fast_forward: 1e-4 of the stream's largest value
    torch.testing.assert_close(hidden, want[0], rtol=0, atol=1e-4 * float(want[0].abs().max()))


@ON_CPU_ONLY
@pytest.mark.slow
def test_dspark_drafts_on_the_fast_runner_are_the_reference_runners(fresh, reference):
    from tfc.runtime.models.dsv41.dspark.fast import FastDsparkDrafter

    assert isinstance(fresh.drafter.drafter, FastDsparkDrafter)  # the blocks on the arena, not dense
    drafts = []
    try:
        for runner in (fresh, reference):
            _step(runner, 0, PROMPT[:30], 0, drafting=True)
            [first] = runner.draft([DraftAsk(0, VERIFY[0], 5)])
            _step(runner, 0, (VERIFY[0], *first), 30, verify=True, drafting=True)
            runner.rollback(0, 32)
            drafts.append((first, *runner.draft([DraftAsk(0, 77, 5)])))
    finally:
        reference.release(0)
    assert drafts[0] == drafts[1] and all(len(d) == 5 for d in drafts[0])
    ctx = fresh.drafter.contexts[0]  # one context from position 0 on: every committed row arrived in order
    assert ctx.state.start == 0 and ctx.end == 32


PROMPTS = [tuple(PROMPT[i : i + 24 + i % 3]) for i in range(4)]


def _requests(n: int = 4):
    from tfc.runtime.engine.request import Request
    from tfc.runtime.engine.sampling import SamplingParams

    def params(i: int) -> SamplingParams:
        return SamplingParams() if i % 2 == 0 else SamplingParams(temperature=1.0, top_p=0.9, seed=i)

    return [Request(PROMPTS[i], params(i), 12) for i in range(n)]


def _run(runner, requests, draft: bool = True) -> tuple[list, dict]:
    """Each request's last event through an engine over the runner, and the engine's draft counts."""
    from tfc.runtime.engine.engine import Engine, EngineConfig
    from tfc.runtime.engine.tokenizer import image_tokenizer

    image = runner.forward.weights.image
    config = EngineConfig(max_seqs=6, max_context=512, chunk=32, draft=draft)
    engine = Engine(runner, image_tokenizer(image, str(image.path)), config)
    engine.start()

    async def go():
        async def last(stream):
            async for event in stream:
                if event.finish:
                    return event

        return await asyncio.gather(*[last(s) for s in engine.submit(requests)])

    try:
        return asyncio.run(go()), engine.draft_stats()
    finally:
        engine.close()


@pytest.fixture(scope="module")
def serial(fast):
    """The requests decoded serially (an engine that does not draft)."""
    events, stats = _run(fast, _requests(), draft=False)
    assert stats["drafts"] == 0
    return [e.tokens for e in events]


def _sha(events) -> list[str]:
    from tfc.runtime.engine.generate import token_sha

    return [token_sha(e.tokens) for e in events]


@pytest.mark.slow
def test_scripted_drafts_through_the_engine_give_serial_tokens_solo_and_at_once(fresh, serial):
    from tfc.runtime.engine.generate import token_sha

    fresh.drafter = Scripted([p + tuple(t) for p, t in zip(PROMPTS, serial, strict=True)], VOCAB)
    solo, stats = _run(fresh, _requests()[1:2])  # seeded
    assert _sha(solo) == [token_sha(serial[1])] and stats["accepted_tokens"] > 0
    events, stats = _run(fresh, _requests())
    assert _sha(events) == [token_sha(t) for t in serial]
    assert stats["note"].startswith("drafting on: up to 5 tokens")
    assert 0 < stats["accepted_tokens"] < stats["draft_tokens"]


@pytest.mark.slow
def test_dspark_drafts_through_the_engine_give_serial_tokens(fresh, serial):
    from tfc.runtime.engine.generate import token_sha

    events, stats = _run(fresh, _requests()[:2])
    assert _sha(events) == [token_sha(t) for t in serial[:2]]
    assert stats["draft_tokens"] > 0


def test_the_warm_up_drafts_and_restores_on_the_fast_runner(fresh):
    # serve's warm-up on this runner: a drafting token, a draft (on a GPU: the drafter's graph captured), the
    # slot's snapshot restored in place; nothing held after it
    from tfc.runtime.engine.warmup import warm_up

    warm_up(fresh, 0, snapshots=True, draft=True)
    assert fresh.kv.pool.free_pages == fresh.kv.pool.pages and not fresh.dspark.contexts
    assert fresh._slots.get(0) is None
