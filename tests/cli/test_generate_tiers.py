"""`tfc generate` of images whose Engram rows are off the device (host memory, NVMe, one of each) gives the device
tier's tokens, on the reference forward and on the fast one."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support.tier_images import tier_image

from tfc.cli import cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

PROMPT = "The model reads the prompt"


@pytest.fixture(scope="module")
def images(tiny_pack, tmp_path_factory):
    return {
        t: tier_image(tiny_pack, tmp_path_factory.mktemp(t), t) for t in ("device", "host", "mixed", "nvme")
    }


def _sha(image, *extra: str) -> str:
    args = [
        "generate",
        str(image),
        "--prompt",
        PROMPT,
        "--max-tokens",
        "8",
        "--device",
        "cpu",
        "--json",
        *extra,
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output.strip().splitlines()[-1])["token_sha"]


@pytest.mark.parametrize("forward", [(), ("--fast",)], ids=["reference", "fast"])
def test_every_tier_generates_the_device_tiers_tokens(images, forward):
    want = _sha(images["device"], *forward)
    assert {t: _sha(images[t], *forward) for t in ("host", "mixed", "nvme")} == dict.fromkeys(
        ("host", "mixed", "nvme"), want
    )
    assert _sha(images["nvme"], *forward, "--no-engram") != want  # the rows read matter to the tokens
