"""Engram rows off the device, on the CPU: the tiny pack prepared with its Engram tables in host memory, on NVMe
(read in place from the image's file) or one on the device and one in host memory places each segment in its
tier at boot and gives the device tier's bits (the fast runner's logits, the reference runner's logits and the
engine's tokens, solo and concurrent); a read that fails fails its sequence alone (nothing of the step ran,
the others run on to their solo tokens); the next prompt chunk's records are read one chunk ahead.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch
from support.fast_steps import decode_alongside
from support.tier_images import tier_image
from tfc.runtime.boot.rank import boot
from tfc.runtime.engine.engine import Engine, EngineConfig
from tfc.runtime.engine.generate import token_sha
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams
from tfc.runtime.engine.scheduler import Running, plan_step, upcoming_chunks
from tfc.runtime.options import RuntimeOptions
from tfc.runtime.records.reader import RecordConfig, RecordReadError
from tfc.runtime.worker.step import RowsUnavailable, SequenceStep, StepPlan, Upcoming
from tfc.runtime.worker.worker import Worker

ROWS = ("layers.1.engram.rows", "layers.2.engram.rows")
FAST = {"slots": 4, "tokens_per_slot": 512, "context_step": 256, "page_tokens": 64}
GEN = 6


@pytest.fixture(scope="module")
def images(tiny_pack, tmp_path_factory):
    return {
        t: tier_image(tiny_pack, tmp_path_factory.mktemp(t), t) for t in ("device", "host", "mixed", "nvme")
    }


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, 640, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


PROMPTS = [tuple(_tokens(20 + 7 * i, 40 + i)) for i in range(3)]


def _segment(booted, name: str) -> np.ndarray:
    entry = booted.image.manifest.segment_map[name]
    return np.frombuffer(booted.image.image.segment(name), np.uint8).reshape(entry.shape[0], -1)


def test_boot_places_each_segment_in_its_tier(images):
    booted = boot(images["mixed"], device="cpu")
    try:
        off = booted.off_device
        assert [off.tier(n) for n in ROWS] == ["device", "host"] and ROWS[0] in booted.arena
        assert ROWS[1] not in booted.arena and not off.pinned  # the CPU has nothing to page-lock for
        np.testing.assert_array_equal(off.source(ROWS[1]).table, _segment(booted, ROWS[1]))
        assert off.source(ROWS[0]) is None
        tiers = next(p for p in booted.phases.phases if p.name == "tiers")
        assert tiers.note == "1 segment(s), 885,456 bytes in plain host memory"
    finally:
        booted.close()
    booted = boot(images["nvme"], device="cpu", records=RecordConfig(cache_records=100, uring=False))
    try:
        off = booted.off_device
        assert [off.tier(n) for n in ROWS] == ["nvme", "nvme"] and off.host is None
        assert {(f.cache.capacity, f.file.method.split(",")[0]) for f in off.files.values()} == {
            (100, "threads")
        }
        assert not any(n in booted.arena for n in ROWS)
        rows = np.array([0, 5, 5, 4000, 12000])
        for name in ROWS:
            np.testing.assert_array_equal(off.source(name).gather(rows), _segment(booted, name)[rows])
        assert "2 read in place (" in next(p for p in booted.phases.phases if p.name == "tiers").note
    finally:
        booted.close()


def _fast_logits(image, staged: list[int]) -> torch.Tensor:
    from tfc.runtime.models.dsv41.fast.build import build_fast

    booted = boot(image, device="cpu")
    try:
        runner = build_fast(booted, **FAST)
        assert sorted(runner.forward.staging.sources if staged else ()) == staged
        other = {1: _tokens(60, 3)}
        return decode_alongside(runner, 0, _tokens(10, 2), other, lambda i, s: (0, 1, 16, 3)[i % 4])
    finally:
        booted.close()


@pytest.mark.slow
def test_the_fast_runner_gives_the_device_tiers_bits(images):
    want = _fast_logits(images["device"], [])
    for tier, staged in (("host", [0, 1]), ("mixed", [1]), ("nvme", [0, 1])):
        assert torch.equal(_fast_logits(images[tier], staged), want), tier


@pytest.fixture(scope="module")
def workers(images):
    """A fast-forward Worker (the kernels' torch references standing in) over each tier's image, with its
    tokenizer."""
    from tfc.runtime.engine.tokenizer import image_tokenizer

    out = {}
    for tier in ("device", "host", "nvme"):
        w = Worker.start(images[tier], device="cpu", options=RuntimeOptions(graphs=False))
        w.load_model(dtype=torch.float32, kind="fast", **FAST)
        w.tokenizer = image_tokenizer(w.booted.image, str(images[tier]))
        out[tier] = w
    yield out
    for w in out.values():
        w.close()


def test_the_reference_feed_reads_the_device_tiers_rows(images):
    from tfc.runtime.models.dsv41.reference.weights import engram_feed, load_dense_weights

    cfg, weights = load_dense_weights(images["device"])  # decoded lazily: the feed reads only its tables
    want = engram_feed(weights, cfg.engram_layer_ids, cfg.engram_head_dim).rows(PROMPTS[0][:3], PROMPTS[1])
    for tier in ("host", "mixed", "nvme"):
        booted = boot(images[tier], device="cpu")
        try:
            feed = engram_feed(weights, cfg.engram_layer_ids, cfg.engram_head_dim, None, booted.off_device)
            got = feed.rows(PROMPTS[0][:3], PROMPTS[1])
            assert all(torch.equal(got[layer], want[layer]) for layer in want), tier
        finally:
            booted.close()


def _serve(runner, tokenizer, prompts) -> list:
    """The last event of each prompt's greedy request, all submitted at once."""
    engine = Engine(runner, tokenizer, EngineConfig(max_seqs=4, max_context=256, chunk=16, draft=False))
    engine.start()

    async def go():
        async def last(stream):
            async for event in stream:
                if event.finish:
                    return event

        return await asyncio.gather(
            *[last(s) for s in engine.submit([Request(p, SamplingParams(), GEN) for p in prompts])]
        )

    try:
        return asyncio.run(go())
    finally:
        engine.close()


@pytest.fixture(scope="module")
def solo(workers):
    """Each prompt's tokens served alone on the device tier."""
    w = workers["device"]
    return [_serve(w, w.tokenizer, [p])[0].tokens for p in PROMPTS]


@pytest.mark.parametrize("tier", ["host", "nvme"])
def test_concurrent_equals_solo_off_the_device(workers, solo, tier):
    w = workers[tier]
    events = _serve(w, w.tokenizer, PROMPTS)
    assert [token_sha(e.tokens) for e in events] == [token_sha(t) for t in solo]
    assert [token_sha(_serve(w, w.tokenizer, [PROMPTS[2]])[0].tokens)] == [token_sha(solo[2])]


class PoisonedFile:
    """A record file whose reads of `bad` rows fail (a drive error), the others read through."""

    def __init__(self, file, bad: set[int]) -> None:
        self.file, self.bad = file, bad

    def read(self, rows: np.ndarray) -> np.ndarray:
        hit = self.bad & set(np.asarray(rows).tolist())
        if hit:
            raise RecordReadError(f"{self.file.path}: reading record {min(hit)} failed (Input/output error)")
        return self.file.read(rows)

    def close(self) -> None:
        self.file.close()


def _local_rows(worker, ids) -> set[int]:
    """Layer 2's local NVMe rows a sequence of ids reads (the tiny image is TP=1: its shard starts at row 0)."""
    return set(worker.runner._plan_ids([(0, list(ids), ())])[0][:, 1].reshape(-1).tolist())


@pytest.fixture
def poisoned(workers):
    """Make the nvme worker's layer-2 reads of some rows fail for one test (its LRU emptied before and after)."""
    src = workers["nvme"].booted.off_device.files[ROWS[1]]
    real = src.file

    def poison(bad: set[int]) -> None:
        src.cache = type(src.cache)(src.cache.capacity, src.record_bytes)
        src.file = PoisonedFile(real, bad)

    yield poison
    src.file = real
    src.cache = type(src.cache)(src.cache.capacity, src.record_bytes)


def test_a_failed_read_fails_its_request_alone(workers, solo, poisoned):
    w = workers["nvme"]
    keep = _local_rows(w, PROMPTS[0] + solo[0]) | _local_rows(w, PROMPTS[2] + solo[2])
    bad = _local_rows(w, PROMPTS[1]) - keep
    assert bad
    poisoned(bad)
    events = _serve(w, w.tokenizer, PROMPTS)
    assert events[1].finish == "error" and events[1].error.startswith("RowsUnavailable: ")
    assert "reading record" in events[1].error and "Input/output error" in events[1].error
    assert [e.tokens for e in (events[0], events[2])] == [solo[0], solo[2]]
    assert _serve(w, w.tokenizer, [PROMPTS[0]])[0].tokens == solo[0]  # it serves on


def test_the_fast_runner_reads_a_plan_before_running_any_of_it(images, workers):
    from tfc.runtime.models.dsv41.fast.build import build_fast

    booted = boot(images["nvme"], device="cpu")
    try:
        runner = build_fast(booted, **FAST)
        src = booted.off_device.files[ROWS[1]]
        keep = _local_rows(workers["nvme"], PROMPTS[0])
        src.file = PoisonedFile(src.file, _local_rows(workers["nvme"], PROMPTS[1]) - keep)
        both = StepPlan(
            (SequenceStep(0, PROMPTS[0], 0, prompt=True), SequenceStep(1, PROMPTS[1], 0, prompt=True))
        )
        with pytest.raises(RowsUnavailable) as info:
            runner.execute(both)
        assert info.value.slots == (1,)
        one = StepPlan((SequenceStep(0, PROMPTS[0], 0, prompt=True, every=True),))
        got = runner.execute(one).logits[0]  # slot 0 is still at position 0: nothing of the failed step ran
    finally:
        booted.close()
    booted = boot(images["device"], device="cpu")
    try:
        assert torch.equal(got, build_fast(booted, **FAST).execute(one).logits[0])
    finally:
        booted.close()


def test_the_next_prompt_chunk_is_read_one_chunk_ahead(images):
    from tfc.runtime.models.dsv41.fast.build import build_fast

    runs = [Running(2, PROMPTS[2]), Running(0, PROMPTS[0], fed=16), Running(3, (5,), [9], fed=1)]
    plan = plan_step(runs, 16, 64)
    assert [row.slot for row in plan.rows] == [3, 2, 0]  # decode rows first
    # the decode row and a prompt's last chunk have none to come
    assert upcoming_chunks(plan, [runs[2], runs[0], runs[1]], 16) == (Upcoming(2, PROMPTS[2], 16, 32),)
    booted = boot(images["nvme"], device="cpu")
    try:
        runner = build_fast(booted, **FAST)
        runner.prefetch((Upcoming(2, PROMPTS[2], 16, 32),))  # read once the next plan's own rows are
        now = runner._plan_ids([(2, PROMPTS[2][:16], ())])[2]
        ahead = runner._plan_ids([(2, PROMPTS[2][16:32], PROMPTS[2][13:16])])[2]
        sources = [booted.off_device.files[name] for name in ROWS]
        runner.execute(StepPlan((SequenceStep(2, PROMPTS[2][:16], 0, prompt=True),)))
        for k, src in enumerate(sources):
            src._settle()
            assert src.cache.has(np.unique(ahead[:, k])).all()
            assert len(src.cache) == len(np.union1d(np.union1d(now[:, k], ahead[:, k]), [0]))
            misses = src.cache.misses
            src.gather(ahead[:, k])  # what the next plan reads: every record already in the LRU
            assert src.cache.misses == misses
    finally:
        booted.close()
