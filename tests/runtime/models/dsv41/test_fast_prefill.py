"""The fast runner's prefill forward on the CPU (the kernels' torch references): prompt rows take wide steps of
their own (by default, in an exact build at TP=1), so a prompt's state does not depend on how it was chunked,
decode rows keep the decode steps, and the engine caches prompt states only (a decoded row's bits are not its
prefilled bits).

The wide steps are 32 rows here, so that a 70-token prompt takes several. TFC_TEST_FAST_DEVICE=cuda runs the same
on a GPU (graphs on), where the prefill forward runs the many-row kernels (kernels/exl3/rows.py) and the decode
steps the decode kernels: agreement between them is then within the decode kernels' fp16 rounding of their
input, test_fast_gpu.py's GPU_ATOL (0.02), instead of fp32 sums' rounding on the CPU."""

from __future__ import annotations

import asyncio

import pytest
import torch
from support.dsv41_image import prepared_image
from tfc.runtime.boot.rank import boot
from tfc.runtime.engine.engine import Engine, EngineConfig
from tfc.runtime.engine.prefix_cache import PrefixSettings
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams
from tfc.runtime.models.dsv41.fast.build import PREFILL_ROWS, FastBuildError, build_fast
from tfc.runtime.options import RuntimeOptions
from tfc.runtime.worker.step import SequenceStep, StepPlan

from tfc import settings

pytestmark = pytest.mark.slow
WIDE = 32
DEVICE = settings.get("TFC_TEST_FAST_DEVICE")


@pytest.fixture(scope="module")
def booted(tiny_pack, tmp_path_factory):
    """The tiny pack's prepared TP=1 image, booted on DEVICE (graphs on a GPU)."""
    if DEVICE == "cuda" and not torch.cuda.is_available():
        pytest.skip("TFC_TEST_FAST_DEVICE=cuda without CUDA")
    b = boot(
        prepared_image(tiny_pack, tmp_path_factory.mktemp("img")),
        device=DEVICE,
        options=RuntimeOptions(graphs=DEVICE == "cuda"),
    )
    yield b
    b.close()


@pytest.fixture(scope="module")
def fast(booted):
    """A fast runner with 32-row prefill steps."""
    return build_fast(
        booted, slots=4, tokens_per_slot=1024, context_step=256, page_tokens=64, prefill_rows=WIDE
    )


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 640, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _prefill(runner, slot: int, toks: list[int], size: int) -> torch.Tensor:
    """The prompt in prompt rows of `size` tokens; the logits after its last token."""
    for lo in range(0, len(toks), size):
        out = runner.execute(StepPlan((SequenceStep(slot, tuple(toks[lo : lo + size]), lo, prompt=True),)))
    return out.logits[0]


def _decode(runner, slot: int, toks: list[int], at: int) -> torch.Tensor:
    return torch.stack(
        [runner.execute(StepPlan((SequenceStep(slot, (t,), at + i),))).logits[0] for i, t in enumerate(toks)]
    )


def test_a_prompts_state_does_not_depend_on_its_chunking(fast):
    toks, after = _tokens(70, 5), _tokens(6, 6)
    steps = fast.prefill_steps
    whole = _prefill(fast, 1, toks, len(toks))
    assert fast.prefill_steps - steps == 3  # 70 rows in 32-row steps
    next_rows = _decode(fast, 1, after, len(toks))
    fast.release(1)
    for size in (1, 7, WIDE, WIDE + 1):
        assert torch.equal(_prefill(fast, 1, toks, size), whole), size
        assert torch.equal(_decode(fast, 1, after, len(toks)), next_rows), size
        fast.release(1)
    assert fast.stats()["prefill"]["rows"] == WIDE


def test_a_prefill_step_runs_the_head_on_the_rows_it_reads_only(fast, monkeypatch):
    toks, other = _tokens(40, 11), _tokens(20, 12)
    want = _prefill(fast, 1, toks, len(toks))
    fast.release(1)
    heads, lin = [], fast.prefill.lin

    def counted(x, name):
        if name == "head":
            heads.append(x.shape[0])
        return lin(x, name)

    monkeypatch.setattr(fast.prefill, "lin", counted)
    # two prompts in one plan: 60 rows in two 32-row steps; only the second holds last rows (one a prompt)
    plan = StepPlan(
        (SequenceStep(1, tuple(toks), 0, prompt=True), SequenceStep(3, tuple(other), 0, prompt=True))
    )
    out = fast.execute(plan)
    assert heads == [16], heads  # HEAD_ROWS: slot 1's and slot 3's last rows, the last repeated
    assert torch.equal(out.logits[0], want)
    fast.release(1)
    fast.release(3)


def test_an_every_row_returns_each_rows_logits_as_its_prefix_alone(fast):
    toks = _tokens(45, 13)
    out = fast.execute(StepPlan((SequenceStep(1, tuple(toks), 0, prompt=True, every=True),)))
    rows = out.logits[0]
    assert tuple(rows.shape) == (45, fast.info.vocab_size)
    fast.release(1)
    for k in (
        1,
        20,
        45,
    ):  # the prompt's state does not depend on its chunking: row k - 1 is its k-id prefix's
        assert torch.equal(rows[k - 1], _prefill(fast, 1, toks[:k], k)), k
        fast.release(1)


def test_prompt_rows_beside_decode_rows_leave_each_as_alone(fast):
    toks, other = _tokens(40, 7), _tokens(50, 8)
    solo_prompt = _prefill(fast, 2, toks, len(toks))
    solo_next = _decode(fast, 2, other[:3], len(toks))
    fast.release(2)
    _prefill(fast, 0, other, len(other))
    # one plan: slot 0 decodes while slot 2's prompt prefills, then both decode together
    out = fast.execute(
        StepPlan((SequenceStep(0, (1,), len(other)), SequenceStep(2, tuple(toks), 0, prompt=True)))
    )
    assert torch.equal(out.logits[1], solo_prompt)
    both = [
        fast.execute(
            StepPlan((SequenceStep(2, (t,), len(toks) + i), SequenceStep(0, (t,), len(other) + 1 + i)))
        )
        for i, t in enumerate(other[:3])
    ]
    assert torch.equal(torch.stack([b.logits[0] for b in both]), solo_next)
    fast.release(0)
    fast.release(2)


def test_the_prefill_forward_agrees_with_the_decode_steps(booted, fast):
    plain = build_fast(
        booted, slots=2, tokens_per_slot=1024, context_step=256, page_tokens=64, prefill_rows=0
    )
    assert plain.prefill is None and not plain.capabilities.prompt_rows and fast.capabilities.prompt_rows
    toks = _tokens(45, 9)
    want, got = plain.logits_of(1, toks, 0)[-1], _prefill(fast, 1, toks, len(toks))
    fast.release(1)
    # the same maths in other shapes and kernels: only the sums' rounding (and on a GPU the decode kernels'
    # fp16 input) differs
    atol = 1e-4 * float(want.abs().max()) if DEVICE == "cpu" else 0.02
    torch.testing.assert_close(got, want, rtol=0, atol=atol)
    with pytest.raises(FastBuildError, match="more than 16"):
        build_fast(booted, slots=2, tokens_per_slot=256, context_step=256, page_tokens=64, prefill_rows=8)


def test_prompt_rows_take_the_prefill_forward_by_default_where_it_is_exact(booted):
    small = {"slots": 2, "tokens_per_slot": 256, "context_step": 256, "page_tokens": 64, "draft": False}
    runner = build_fast(booted, **small)
    assert runner.capabilities.prompt_rows and runner.stats()["prefill"]["rows"] == PREFILL_ROWS[DEVICE]
    assert runner.kv.layout.step_rows == PREFILL_ROWS[DEVICE]  # the window ring holds a prefill step's rows
    for plain in (build_fast(booted, **small, tp_exact=True), build_fast(booted, **small, exact=False)):
        assert (
            plain.prefill is None and not plain.capabilities.prompt_rows
        )  # a world's products; a loose build


def test_the_engine_caches_prompt_states_only_when_prompt_rows_differ(booted, fast):
    from tfc.runtime.engine.tokenizer import image_tokenizer

    prompt = tuple(_tokens(37, 10))
    config = EngineConfig(max_seqs=2, max_context=512, chunk=16, prefix=PrefixSettings())
    engine = Engine(fast, image_tokenizer(booted.image, str(booted.image.path)), config)
    engine.start()
    try:

        async def go():
            (stream,) = engine.submit([Request(prompt, SamplingParams(temperature=0.0), 5)])
            async for event in stream:
                if event.finish:
                    return event

        assert asyncio.run(go()).finish
        held = sorted(e.tokens for e in engine.prefix._entries.values())
        assert held == [16, 32, 37]  # chunk boundaries and the prompt's end; never a state past it
    finally:
        engine.close()
