"""Cold experts on the CPU: the tiny pack prepared for a GPU too small for its routed expert tables keeps
those of layers 1, 3, 5 and 7 in host memory; the boot places them there (not in the arena), the fast
forward's MoE reads them in place and gives the all-device image's logits bit for bit, and the engine's
tokens, solo and concurrent.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from support.fast_steps import decode_alongside
from support.tier_images import COLD_LAYERS, tier_image
from tfc.runtime.boot.rank import boot
from tfc.runtime.engine.engine import Engine, EngineConfig
from tfc.runtime.engine.generate import token_sha
from tfc.runtime.engine.request import Request
from tfc.runtime.engine.sampling import SamplingParams
from tfc.runtime.models.dsv41.fast.build import build_fast

FAST = {"slots": 4, "tokens_per_slot": 512, "context_step": 256, "page_tokens": 64}


@pytest.fixture(scope="module")
def images(tiny_pack, tmp_path_factory):
    return {t: tier_image(tiny_pack, tmp_path_factory.mktemp(t), t) for t in ("device", "cold")}


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(3, 640, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_the_boot_keeps_cold_expert_tables_in_host_memory(images):
    booted = boot(images["cold"], device="cpu")
    try:
        off, plan = booted.off_device, booted.image.manifest.plan["placement"]
        assert plan["cold_layers"] == list(COLD_LAYERS)
        for layer in range(8):
            for proj in ("w1", "w2", "w3"):
                name = f"layers.{layer}.ffn.experts.{proj}.trellis"
                assert (off.tier(name), name in booted.arena) == (
                    ("host", False) if layer in COLD_LAYERS else ("device", True)
                ), name
        runner = build_fast(booted, **FAST)
        table = runner.forward.weights.experts("layers.1").w1.trellis
        host = off.host.raw("layers.1.ffn.experts.w1.trellis")
        assert table.data_ptr() == host.data_ptr()  # read in place, not copied
    finally:
        booted.close()


def _fast_logits(image) -> torch.Tensor:
    booted = boot(image, device="cpu")
    try:
        runner = build_fast(booted, **FAST)
        other = {1: _tokens(60, 3)}
        return decode_alongside(runner, 0, _tokens(10, 2), other, lambda i, s: (0, 1, 16, 3)[i % 4])
    finally:
        booted.close()


def test_the_fast_forward_gives_the_all_device_bits(images):
    assert torch.equal(_fast_logits(images["cold"]), _fast_logits(images["device"]))


def _serve(image, prompts) -> list[str]:
    """Token hashes of each prompt's greedy request, all submitted at once."""
    from tfc.runtime.engine.tokenizer import image_tokenizer
    from tfc.runtime.options import RuntimeOptions
    from tfc.runtime.worker.worker import Worker

    w = Worker.start(image, device="cpu", options=RuntimeOptions(graphs=False))
    w.load_model(dtype=torch.float32, kind="fast", **FAST)
    config = EngineConfig(max_seqs=4, max_context=256, chunk=16, draft=False)
    engine = Engine(w, image_tokenizer(w.booted.image, str(image)), config)
    engine.start()

    async def go():
        async def last(stream):
            async for event in stream:
                if event.finish:
                    return token_sha(event.tokens)

        return await asyncio.gather(
            *[last(s) for s in engine.submit([Request(p, SamplingParams(), 6) for p in prompts])]
        )

    try:
        return asyncio.run(go())
    finally:
        engine.close()
        w.close()


@pytest.mark.slow
def test_the_engine_serves_the_all_device_tokens(images):
    prompts = [tuple(_tokens(20 + 7 * i, 40 + i)) for i in range(3)]
    solo = [_serve(images["device"], [p])[0] for p in prompts]
    assert _serve(images["cold"], prompts) == solo
