"""`tfc generate` on the demo's tiny image prints the tokens it printed before the runtime went through a Worker."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tfc.cli import cli

PROMPT = "The model reads the prompt"
PROMPT_IDS = [0, 297, 315, 522, 363, 331, 265, 317, 518]
# Printed by `tfc generate ... --json` on the tiny image at the commit before the Worker (48116ee); the seeded
# tokens changed once since, when the sampler became keyed by seed and position (ac1674d), and are pinned
# again from there (they were [533, 330, 210, ...] with the sequential generator).
GREEDY = [211, 328, 53, 279, 120, 314, 282, 21, 143, 422, 209, 269, 232, 557, 585, 313]
SEEDED = [230, 222, 591, 466, 566, 346, 149, 498, 510, 52, 81, 425, 82, 213, 146, 200]
CHAT = [459, 294, 99, 563, 313, 93, 7, 165]


@pytest.fixture
def image(tiny_image):
    return tiny_image


def _run(image: str, *args: str) -> dict:
    result = CliRunner().invoke(cli, ["generate", image, "--json", "--device", "cpu", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])


def test_greedy_tokens_are_pinned(image):
    out = _run(image, "--prompt", PROMPT, "--max-tokens", "16")
    assert out["prompt_tokens"] == PROMPT_IDS and out["tokens"] == GREEDY and out["finish"] == "length"


def test_seeded_tokens_are_pinned(image):
    args = ["--temperature", "0.8", "--top-p", "0.9", "--seed", "7"]
    assert _run(image, "--prompt", PROMPT, "--max-tokens", "16", *args)["tokens"] == SEEDED


def test_chat_tokens_are_pinned(image):
    out = _run(image, "--prompt", "Hello", "--chat", "--max-tokens", "8")
    assert out["prompt_tokens"] == [0, 634, 404, 635, 637] and out["tokens"] == CHAT
