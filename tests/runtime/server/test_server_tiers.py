"""`tfc serve` of images whose Engram rows are off the device: concurrent == solo == the device tier's tokens (host
memory, NVMe); a read that fails once serving (the rank file cut short under it) is a 500 naming the file for
that request while the server keeps serving the others; a missing or short image file refuses at start in one
line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.server import ServerProcess
from support.tier_images import nvme_segment, tier_image

pytestmark = pytest.mark.slow

PROMPTS = ["The model reads the prompt", "Hello", "layer norm experts", "a b c d e f g"]


def _body(prompt: str) -> dict:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 6, "temperature": 0}


def _sha(server: ServerProcess, prompt: str) -> str:
    status, reply, _ = server.request("POST", "/v1/completions", _body(prompt), timeout=120)
    assert status == 200, reply
    return reply["choices"][0]["token_sha"]


def _together(server: ServerProcess, prompts: list[str]) -> list:
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(
            pool.map(lambda p: server.request("POST", "/v1/completions", _body(p), timeout=120), prompts)
        )


@pytest.fixture(scope="module")
def images(tiny_pack, tmp_path_factory):
    return {t: tier_image(tiny_pack, tmp_path_factory.mktemp(t), t) for t in ("device", "host", "nvme")}


@pytest.fixture(scope="module")
def device_shas(images, tmp_path_factory):
    with ServerProcess(
        images["device"], "--model-name", "tiny", log=tmp_path_factory.mktemp("log") / "s"
    ) as s:
        return [_sha(s, p) for p in PROMPTS]


@pytest.mark.parametrize("tier", ["host", "nvme"])
def test_concurrent_equals_solo_equals_the_device_tier(images, device_shas, tier, tmp_path):
    with ServerProcess(images[tier], "--model-name", "tiny", "--no-prefix-cache", log=tmp_path / "log") as s:
        assert [_sha(s, p) for p in PROMPTS] == device_shas
        together = _together(s, PROMPTS)
        assert [r[1]["choices"][0]["token_sha"] for r in together] == device_shas
        assert "boot tiers" in s.output()


def test_a_failed_read_is_a_500_for_its_request_and_the_server_serves_on(images, device_shas, tmp_path):
    image = tmp_path / "image"
    shutil.copytree(images["nvme"], image)
    with ServerProcess(image, "--model-name", "tiny", "--no-prefix-cache", log=tmp_path / "log") as s:
        assert _sha(s, PROMPTS[0]) == device_shas[0]  # its records are now in the LRU
        for layer in (1, 2):  # the drive loses the tables: every record not cached fails to read
            seg = nvme_segment(image, layer)
            os.truncate(image / seg["file"], seg["offset"])
        fresh = "an unseen prompt of many words whose table rows nothing has read before now"
        (status, reply, _), (ok, good, _) = _together(s, [fresh, PROMPTS[0]])
        assert status == 500 and reply["error"]["type"] == "server_error", reply
        assert (
            "RowsUnavailable" in reply["error"]["message"]
            and "the file is shorter" in reply["error"]["message"]
        )
        assert ok == 200 and good["choices"][0]["token_sha"] == device_shas[0]
        assert _sha(s, PROMPTS[0]) == device_shas[0]
        assert s.get("/health")[0] == 200


@pytest.mark.parametrize("damage", ["missing", "short"])
def test_a_missing_or_short_image_file_refuses_at_start_in_one_line(images, tmp_path, damage):
    image = tmp_path / "image"
    shutil.copytree(images["nvme"], image)
    path = image / nvme_segment(image, 2)["file"]
    if damage == "missing":
        path.unlink()
    else:
        os.truncate(path, nvme_segment(image, 2)["offset"] + 1000)
    r = subprocess.run([sys.executable, "-m", "tfc", "serve", str(image), "--device", "cpu", "--port", "0"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)  # fmt: skip
    lines = [x for x in r.stderr.splitlines() + r.stdout.splitlines() if x.startswith("tfc: error:")]
    assert r.returncode == 2 and len(lines) == 1, r.stderr + r.stdout
    assert str(path) in lines[0] and ("missing" in lines[0] or "truncated" in lines[0])
