"""`tfc generate` of images whose Engram rows are off the device (host memory, NVMe, one of each), or whose cold
expert tables are in host memory too, gives the device tier's tokens, on the reference forward and the fast one."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from support.tier_images import tier_image

from tfc.cli import cli

pytestmark = pytest.mark.slow

PROMPT = "The model reads the prompt"


@pytest.fixture(scope="module")
def images(tiny_pack, tmp_path_factory):
    return {
        t: tier_image(tiny_pack, tmp_path_factory.mktemp(t), t)
        for t in ("device", "host", "mixed", "nvme", "cold")
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
    tiers = ("host", "mixed", "nvme", "cold")
    assert {t: _sha(images[t], *forward) for t in tiers} == dict.fromkeys(tiers, want)
    assert _sha(images["nvme"], *forward, "--no-engram") != want  # the rows read matter to the tokens


def test_tp2_ranks_read_their_own_shards_from_nvme(tiny_pack, tmp_path):
    # each rank reads its own hash columns' rows from its own rank file; the ranks gather them as from the arena
    def prepare(store, *extra):
        result = CliRunner().invoke(cli, ["prepare", str(tiny_pack), "--tp", "2", "-o", str(store),
                                          "--engram-dir", str(tiny_pack), *extra])  # fmt: skip
        assert result.exit_code == 0, result.output
        return next(p for p in store.iterdir() if p.is_dir() and not p.name.startswith("."))

    placed = prepare(tmp_path / "nvme", "--gpu-memory-gib", "0.017", "--host-memory-gib", "0.0001", "--nvme",
                     str(tmp_path), "--overhead-gib", "0", "--max-context", "256", "--max-seqs", "1")  # fmt: skip
    manifest = json.loads((placed / "rank1" / "manifest.json").read_text())
    assert {s.get("tier") for s in manifest["segments"] if s["name"].endswith(".engram.rows")} == {"nvme"}
    assert _sha(placed) == _sha(prepare(tmp_path / "device"))
