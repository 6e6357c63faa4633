"""The fast runner's slot snapshots (the prefix cache's entries) on the CPU: resumed == fresh bit for bit.

A sequence restored at a position into another slot (from the snapshot, its host copy or its bytes) gives the
logits the original slot gives from there on, at boundaries inside a compressor group, at the window's edge and
past a page; damaged bytes are refused; pages return to the pool.
"""

from __future__ import annotations

import pytest
import torch
from support.dsv41_image import prepared_image
from tfc.runtime.boot.rank import boot
from tfc.runtime.models.dsv41.fast.build import build_fast
from tfc.runtime.models.dsv41.fast.kv.snapshot import KvSnapshotError
from tfc.runtime.worker.runner import snapshots_of
from tfc.runtime.worker.step import SequenceStep, StepPlan

pytestmark = pytest.mark.slow

PROMPT = torch.randint(0, 640, (90,), generator=torch.Generator().manual_seed(5)).tolist()
TAIL = [7, 300, 21, 5, 611, 42]


@pytest.fixture(scope="module")
def fast(tiny_pack, tmp_path_factory):
    """A fast runner of 4 slots on a CPU arena, pages of 32 tokens."""
    booted = boot(prepared_image(tiny_pack, tmp_path_factory.mktemp("img")), device="cpu")
    yield build_fast(booted, slots=4, tokens_per_slot=512, context_step=256, page_tokens=32)
    booted.close()


def _feed(runner, slot: int, tokens: list[int], start: int) -> list[torch.Tensor]:
    """Each token's last-position logits, fed one a step from `start`."""
    out = []
    for i, t in enumerate(tokens):
        out.append(runner.execute(StepPlan((SequenceStep(slot, (t,), start + i),))).logits[0])
    return out


@pytest.mark.parametrize(
    "at", [33, 41, 64]
)  # past the window (32) inside a ratio-2 group; a page edge + 9; 2 pages
def test_a_restored_slot_continues_as_the_original(fast, at):
    assert snapshots_of(fast) is fast
    free = fast.kv.pool.free_pages
    try:
        fast.execute(StepPlan((SequenceStep(0, tuple(PROMPT[:at]), 0),)))
        snap = fast.snapshot(0)
        want = _feed(fast, 0, TAIL, at)
        host = snap.to_host()  # one buffer, every tensor a view of it (restore sends it up in one transfer)
        base = host.packed.untyped_storage().data_ptr()
        assert all(t.untyped_storage().data_ptr() == base for _, t in host.tensors)
        for slot, entry in ((1, snap), (2, host), (3, fast.load_snapshot(snap.to_bytes()))):
            fast.restore(slot, entry)
            got = _feed(fast, slot, TAIL, at)
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), (at, slot)
        fast.restore(0, snap)  # back into the slot it came from, over its later rows
        assert all(torch.equal(a, b) for a, b in zip(_feed(fast, 0, TAIL, at), want, strict=True))
    finally:
        for slot in range(4):
            fast.release(slot)
    assert fast.kv.pool.free_pages == free


def test_damaged_snapshot_bytes_are_refused(fast):
    fast.execute(StepPlan((SequenceStep(0, tuple(PROMPT[:20]), 0),)))
    data = fast.snapshot(0).to_bytes()
    fast.release(0)
    for bad in (data[:-1], b"x" + data[1:], data[:40]):
        with pytest.raises(KvSnapshotError):
            fast.load_snapshot(bad)


@pytest.mark.parametrize("tier", ["device", "host", "disk"])
def test_the_engine_resumes_a_prompt_on_the_fast_runner_as_fresh(fast, tiny_image, tmp_path, tier):
    import asyncio

    from tfc.runtime.engine.engine import Engine, EngineConfig
    from tfc.runtime.engine.generate import token_sha
    from tfc.runtime.engine.prefix_cache import PrefixSettings
    from tfc.runtime.engine.request import Request
    from tfc.runtime.engine.sampling import SamplingParams
    from tfc.runtime.engine.tokenizer import image_tokenizer

    tokenizer = image_tokenizer(fast.forward.weights.image, str(tiny_image))
    settings = {"device": PrefixSettings(), "host": PrefixSettings(device_bytes=0, host_bytes=1 << 30),
                "disk": PrefixSettings(device_bytes=0, host_bytes=0, disk=tmp_path / "disk")}  # fmt: skip

    def run(prefix, prompts):
        engine = Engine(fast, tokenizer, EngineConfig(max_seqs=4, max_context=512, chunk=16, prefix=prefix))
        engine.start()

        async def go():
            out = []
            for p in prompts:  # one after another: the second finds the first's states
                (stream,) = engine.submit([Request(tuple(p), SamplingParams(temperature=1.0, seed=3), 4)])
                async for event in stream:
                    if event.finish:
                        out.append(event)
            return out

        try:
            return asyncio.run(go())
        finally:
            engine.close()

    (fresh,) = run(None, [PROMPT[:60]])
    first, resumed = run(settings[tier], [PROMPT[:41], PROMPT[:60]])
    assert first.usage.cached_tokens == 0 and resumed.usage.cached_tokens == 41
    assert token_sha(resumed.tokens) == token_sha(fresh.tokens)
    assert fast.kv.pool.free_pages == fast.kv.pool.pages
