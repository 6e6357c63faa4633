"""Fixtures of the engine tests that run on the tiny image's reference runner."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def worker(tiny_image):
    """A CPU Worker of 16 slots over the tiny image, with its tokenizer and its DSpark drafter kept as `dspark`
    (tests that put another drafter into the runner's hook put this one back)."""
    from tfc.runtime.engine.tokenizer import image_tokenizer
    from tfc.runtime.options import RuntimeOptions
    from tfc.runtime.worker.worker import Worker

    w = Worker.start(tiny_image, device="cpu", options=RuntimeOptions(graphs=False))
    w.load_model(dtype=torch.float32, slots=16)
    w.tokenizer = image_tokenizer(w.booted.image, str(tiny_image))
    w.dspark = w.runner.drafter
    yield w
    w.close()
