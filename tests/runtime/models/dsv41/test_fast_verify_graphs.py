"""Verify windows on the fast runner are graphed per window size like decode steps (CPU, a recording backend).

A verify row of w tokens (the last token and w - 1 drafts) runs as one step keyed by row bucket w: its first
window of each size is captured, later ones replay, and a replayed window's logits equal an eager runner's.
The CUDA backend itself is covered by tests/runtime/models/dsv41/test_fast_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from support.dsv41_image import prepared_image
from tfc.runtime.boot.rank import boot
from tfc.runtime.graphs.graph_cache import GraphCache, GraphSettings
from tfc.runtime.models.dsv41.fast.build import build_fast
from tfc.runtime.models.dsv41.fast.graph_keys import StepKey
from tfc.runtime.worker.step import SequenceStep, StepPlan

pytestmark = pytest.mark.slow

PROMPT = [5, 81, 300, 7, 42, 610, 13, 99]


class Recording:
    """A capture backend that keeps the step and runs it again on replay, counting both."""

    def __init__(self) -> None:
        self.captured: list = []
        self.replays = 0

    def capture(self, step):
        step()
        self.captured.append(step)
        return step

    def replay(self, graph) -> None:
        self.replays += 1
        graph()

    def release(self, graph) -> None:
        pass


@pytest.fixture(scope="module")
def image(tiny_pack, tmp_path_factory):
    return prepared_image(tiny_pack, tmp_path_factory.mktemp("img"))


def _recording() -> tuple[Recording, GraphCache]:
    """A graph cache over a recording backend, and the backend."""
    backend = Recording()
    return backend, GraphCache(GraphSettings(), backend=backend)


def _runner(image, graphs: GraphCache | None):
    booted = boot(image, device="cpu")
    runner = build_fast(booted, slots=4, tokens_per_slot=512, context_step=256, page_tokens=32)
    if graphs is not None:
        runner.graphs = graphs
    return booted, runner


def _window(runner, slot: int, tokens: list[int], position: int) -> torch.Tensor:
    runner.execute(StepPlan((SequenceStep(slot, tuple(PROMPT), 0),)))
    out = runner.execute(StepPlan((SequenceStep(slot, tuple(tokens), position, verify=True),))).logits[0]
    runner.release(slot)
    return out


def test_verify_windows_are_captured_once_per_size_and_replayed(image):
    backend, cache = _recording()
    booted, graphed = _runner(image, cache)
    b_eager, eager = _runner(image, GraphCache(GraphSettings(max_graphs=0)))
    try:
        assert not any(StepKey(w, 256) in cache for w in (2, 4, 6))
        for w in (2, 4, 6):
            window = [17, 402, 9, 555, 230, 61][:w]
            first = _window(graphed, 0, window, len(PROMPT))
            captures = len(backend.captured)
            again = _window(graphed, 1, window, len(PROMPT))
            assert len(backend.captured) == captures, f"window {w} captured twice"
            assert torch.equal(first, again) and first.shape[0] == w
            assert torch.equal(again, _window(eager, 0, window, len(PROMPT)))
        assert all(StepKey(w, 256) in cache for w in (2, 4, 6))
        assert backend.replays >= 3
    finally:
        booted.close()
        b_eager.close()


def test_a_drafts_blocks_are_one_graph_step_captured_once_and_replayed(image):
    # the DSpark drafter's blocks and head as a GraphCache step: the first draft captures it, later drafts replay
    # it, and every draft (tokens, logits) equals an eager drafter's on the same rows, the ring's context growing
    # and then past the window
    from tfc.runtime.models.dsv41.dspark.drafter import DraftInput
    from tfc.runtime.models.dsv41.dspark.fast import FastDsparkDrafter

    backend, cache = _recording()
    booted, runner = _runner(image, None)
    try:
        graphed, eager = FastDsparkDrafter(runner.forward, cache), FastDsparkDrafter(runner.forward)
        gen = torch.Generator().manual_seed(9)
        width = len(runner.forward.capture) * runner.forward.cfg.hidden_size
        pieces = [torch.randn(n, width, generator=gen) for n in (40, 1, 6, 120, 2)]
        states = [graphed.new_state(), eager.new_state()]
        for i, hidden in enumerate(pieces):
            a, b = (d.draft(s, hidden, 17 + 40 * i, 5) for d, s in zip((graphed, eager), states, strict=True))
            assert a.tokens == b.tokens and torch.equal(a.logits, b.logits), i
        assert graphed.graph_key(1) in cache and len(backend.captured) == 1
        assert backend.replays == len(pieces)  # the first draft captures, then replays like the rest
        # three sequences drafting together: one step of four sequences' shapes, captured once, then replayed
        together = [graphed.new_state() for _ in range(3)], [eager.new_state() for _ in range(3)]
        for i, n in enumerate((30, 2)):
            hidden = [torch.randn(n, width, generator=gen) for _ in range(3)]
            a, b = (d.draft_many([DraftInput(s, h, 5 + s.position % 7, 4) for s, h in zip(ss, hidden, strict=True)])
                    for d, ss in zip((graphed, eager), together, strict=True))  # fmt: skip
            assert [d.tokens for d in a] == [d.tokens for d in b], i
            assert all(torch.equal(x.logits, y.logits) for x, y in zip(a, b, strict=True)), i
        assert (
            graphed.graph_key(4) in cache
            and len(backend.captured) == 2
            and backend.replays == len(pieces) + 2
        )
    finally:
        booted.close()


def test_after_the_warm_up_a_drafted_generate_captures_nothing(image):
    # the warm-up captures the decode step, the drafter's replay and a verify window of every draft length, so a
    # drafting request (every `tfc generate`) replays graphs only: no capture lands inside its decode
    from tfc.runtime.engine.generate import generate
    from tfc.runtime.engine.sampling import SamplingParams
    from tfc.runtime.engine.warmup import warm_up

    backend, cache = _recording()
    booted, runner = _runner(image, cache)
    try:
        runner.drafter.drafter._graphs = cache  # the drafter's replays through the recording cache too
        warm_up(runner, runner.info.bos_id, draft=True)
        warm = len(backend.captured)
        windows = [StepKey(k + 1, runner.buckets[0]) for k in range(1, runner.draft_block + 1)]
        assert StepKey(1, runner.buckets[0]) in cache and all(key in cache for key in windows)
        out = generate(runner, [tuple(PROMPT * 3)], 24, SamplingParams())
        assert out[0].drafted.drafts > 0 and len(backend.captured) == warm
    finally:
        booted.close()
