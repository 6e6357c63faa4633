"""The fast forward on the CPU (the kernels' torch references standing in) over the tiny image, against the reference.

Tolerances: fast is fp32 throughout where the reference rounds fp64 results to fp32 per module; now and then
a cached value lies so near an FP8 / FP4 rounding midpoint that the two land on different codes, which moves
that layer's output by ~1e-5 of its scale. So the logits of 520 teacher-forced random positions stay within
LOGIT_ATOL = 1e-4 (3e-4 of their spread; measured 1.3e-6 to 6.2e-6 over seeds 1 and 11) and every layer's
streams within STREAM_RTOL = 1e-4 of their largest value (measured up to 1.4e-5, a flip in layer 0's window),
at every layer mode; top-1 agrees at >= 99 % of the positions (measured 100 %). Exactness holds bit for bit: a token's
logits do not depend on how its prompt was chunked, on the other sequences of its steps, or on its slot,
and prefill gives the bits one-token decode gives.
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from support.dense_check import fast_layers, reference_layers
from support.dsv41_image import prepared_image
from support.fast_steps import decode_alongside
from tfc.runtime.boot.rank import boot
from tfc.runtime.models.dsv41.fast.build import build_fast
from tfc.runtime.models.dsv41.reference.forward import Dsv41Model
from tfc.runtime.models.dsv41.reference.weights import engram_feed, load_dense_weights
from tfc.runtime.worker.step import SequenceStep, StepPlan
from tfc.runtime.worker.worker import Worker

from tfc.cli import cli

LOGIT_ATOL = 1e-4
STREAM_RTOL = 1e-4
POSITIONS = 520  # past the window (32), many compressed entries (index_topk 16), candidate blocks, page ends

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def image(tiny_pack, tmp_path_factory):
    """The tiny pack's prepared TP=1 image (with its Engram tables)."""
    return prepared_image(tiny_pack, tmp_path_factory.mktemp("img"))


@pytest.fixture(scope="module")
def fast(image):
    """A fast runner of 6 slots on a CPU arena (context buckets of 256 tokens keep the CPU's work small)."""
    booted = boot(image, device="cpu")
    yield build_fast(booted, slots=6, tokens_per_slot=1024, context_step=256, page_tokens=64)
    booted.close()


@pytest.fixture(scope="module")
def reference(image):
    """(reference model, Engram feed) over the same image."""
    cfg, weights = load_dense_weights(image)
    return Dsv41Model(cfg, weights), engram_feed(weights, cfg.engram_layer_ids, cfg.engram_head_dim)


def _tokens(n: int, seed: int, vocab: int = 640) -> list[int]:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_fast_matches_the_reference_teacher_forced_at_every_layer_mode(fast, reference):
    model, feed = reference
    cfg = model.config
    toks = _tokens(POSITIONS, 11)
    want, layers = reference_layers(model, toks, [feed.rows([], toks)])
    got, streams = fast_layers(fast, 0, toks)
    assert got.shape == want.shape == (POSITIONS, cfg.vocab_size)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.99
    torch.testing.assert_close(got, want, rtol=0, atol=LOGIT_ATOL)
    for layer, (mine, ref) in enumerate(zip(streams, layers, strict=True)):
        bound = STREAM_RTOL * float(ref.abs().max())
        torch.testing.assert_close(mine, ref, rtol=0, atol=bound, msg=f"layer {layer}")
    assert {m.mode for m in cfg.modes} == {"swa", "full", "reindex", "reuse"}
    assert want.std() > 0.1


def test_prefill_chunking_and_decode_give_the_same_bits(fast):
    toks = _tokens(70, 5)
    whole = fast.logits_of(1, toks, 0)
    fast.release(1)
    for size in (5, 16, 23):
        parts = [fast.logits_of(1, toks[lo : lo + size], lo) for lo in range(0, len(toks), size)]
        assert torch.equal(torch.cat(parts), whole), size
        fast.release(1)
    decoded = [fast.execute(StepPlan((SequenceStep(1, (t,), i),))).logits[0] for i, t in enumerate(toks)]
    assert torch.equal(torch.stack(decoded), whole)
    fast.release(1)


def test_concurrent_equals_solo_in_any_slot(fast):
    toks = _tokens(40, 7)
    solo = fast.logits_of(2, toks, 0)
    fast.release(2)
    others = {s: _tokens(60, 20 + s) for s in (0, 1, 3, 5)}
    # 0 to 3 tokens each: steps of 1 to 14 rows, prefill and decode mixed; the sequence in another slot now
    got = decode_alongside(fast, 4, toks, others, lambda i, s: (i + s) % 4)
    assert torch.equal(got, solo)


def test_a_row_keeps_its_bits_in_wide_steps_at_any_place(image):
    # 40 sequences a step, 1 to 3 rows each: steps of 40 to 80 rows (buckets 48, 64, 96, 128), the sequence's
    # row last, in the step's third to seventh 16-row chunk
    others = {s: _tokens(40, 30 + s) for s in range(1, 40)}
    solo, got, steps = _own_runner(image, _tokens(10, 17), 40, others, lambda i, s: 1 + (i + s) % 3, last=True,
                                   slots=41, tokens_per_slot=256, context_step=64, page_tokens=16)  # fmt: skip
    assert torch.equal(got, solo)
    assert max(steps) > 64 and min(steps) >= 40  # every plan one step


def test_a_row_does_not_depend_on_its_steps_context_bucket(image):
    # buckets of 16 tokens: at ratio 2 a small bucket holds fewer entries (8) than index_topk (16); the other
    # sequence prefills 150 tokens in the first step, then decodes: its steps' buckets are ~160
    solo, got, _ = _own_runner(image, _tokens(30, 13), 2, {1: _tokens(200, 14)}, lambda i, s: 150 if i == 0 else 1,
                               slots=3, tokens_per_slot=512, context_step=16, page_tokens=16)  # fmt: skip
    assert torch.equal(got, solo)


def _own_runner(image, toks, slot, others, takes, last=False, **build):
    """(toks' logits decoded alone in slot 0, the same in `slot` beside `others` (decode_alongside), the live rows
    of every step those ran in) on a CPU runner of its own built with `build`."""
    booted = boot(image, device="cpu")
    try:
        runner = build_fast(booted, **build)
        solo = runner.logits_of(0, toks, 0)
        runner.release(0)
        steps: list[int] = []
        tiles = runner._tiles

        def cut(plan):
            out = tiles(plan)
            steps.extend(len(tile.rows) for _, tile in out)
            return out

        runner._tiles = cut
        return solo, decode_alongside(runner, slot, toks, others, takes, last), steps
    finally:
        booted.close()


def test_released_slots_give_their_pages_back_and_run_fresh(fast):
    free = fast.kv.pool.free_pages
    addresses = [t.data_ptr() for t in fast.kv.tensors]
    toks = _tokens(150, 9)
    first = fast.execute(StepPlan((SequenceStep(3, tuple(toks), 0),))).logits[0]
    assert fast.kv.pool.free_pages == free - 3  # 150 tokens on 64-token pages
    fast.release(3)
    assert fast.kv.pool.free_pages == free
    again = fast.execute(StepPlan((SequenceStep(3, tuple(toks), 0),))).logits[0]
    assert torch.equal(first, again)
    assert [t.data_ptr() for t in fast.kv.tensors] == addresses
    fast.release(3)


def test_plans_the_runner_refuses(fast):
    from tfc.runtime.models.dsv41.fast.runner import FastStepError

    for plan, why in [
        (StepPlan((SequenceStep(6, (1,), 0),)), "outside"),
        (StepPlan((SequenceStep(0, (1,), 3),)), "at position 0"),
        (StepPlan((SequenceStep(0, (1,), 0), SequenceStep(0, (2,), 1))), "twice"),
        (StepPlan((SequenceStep(0, (640,), 0),)), "token ids"),
        (StepPlan((SequenceStep(0, (1,) * 1025, 0),)), "1024 tokens"),
    ]:
        with pytest.raises(FastStepError, match=why):
            fast.execute(plan)


def test_worker_picks_the_runner_kind(image):
    worker = Worker.start(image, device="cpu")
    try:
        worker.load_model(dtype=torch.float32, slots=2)
        assert worker.kind == "reference"  # auto: a CPU keeps the reference
        worker.load_model(dtype=torch.float32, slots=2, kind="fast", tokens_per_slot=512)
        assert worker.kind == "fast" and worker.capacity.slots == 2 and worker.info.context == 512
    finally:
        worker.close()


def test_generate_fast_on_the_cpu_gives_the_reference_tokens(image):
    args = [
        "generate",
        str(image),
        "--prompt",
        "Hello there",
        "--max-tokens",
        "6",
        "--device",
        "cpu",
        "--json",
    ]
    runs = {}
    for flag in ("--fast", "--reference"):
        result = CliRunner().invoke(cli, [*args, flag])
        assert result.exit_code == 0, result.output
        runs[flag] = json.loads(result.output.strip().splitlines()[-1])
    fast_run, ref_run = runs["--fast"], runs["--reference"]
    assert fast_run["runner"] == "fast" and ref_run["runner"] == "reference"
    assert fast_run["token_sha"] == ref_run["token_sha"] and len(fast_run["tokens"]) == 6
    assert fast_run["prefill_tok_s"] > 0 and fast_run["decode_tok_s"] > 0
    # the graph cache's steps, all eager on a CPU: the warm-up's decode step (its prompt token and the prompt take
    # the prefill forward, outside the cache) and its verify window of each of the 5 draft lengths, a step per
    # token but the last, and the drafter's step for the warm-up's draft and each round's
    eager = 1 + 5 + 5 + 1 + fast_run["drafting"]["drafts"]
    assert fast_run["graphs"] == {"enabled": False, "captures": 0, "replays": 0, "eager": eager, "held": 0}
    result = CliRunner().invoke(cli, [*args, "--fast", "--reference"])
    assert result.exit_code == 2 and "exclude each other" in result.output
