"""`tfc serve` on the GPU's fast forward, many streams at once through the official openai client: every reply of
64 and of 200 concurrent requests (greedy and seeded, one decode step holding them all) has the token_sha it has
alone (skipped without CUDA)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from support.server import ServerProcess

pytestmark = pytest.mark.gpu

PROMPTS = ["The model reads the prompt", "Hello", "layer norm experts", "a b c d e f g", "tokens tokens"]


@pytest.fixture(scope="module")
def wide(served_image, tmp_path_factory):
    """A server of 200 slots on the GPU (the fast forward's steps of up to 256 rows)."""
    log = tmp_path_factory.mktemp("wide-serve") / "serve.log"
    with ServerProcess(served_image, "--max-seqs", "200", "--model-name", "tiny", device="cuda", log=log,
                       ready_s=300) as proc:  # fmt: skip
        yield proc


def _ask(i: int) -> dict:
    ask = {"prompt": PROMPTS[i % len(PROMPTS)] + f" {i}", "max_tokens": 8 + i % 7, "temperature": 0}
    if i % 2:
        ask.update(temperature=0.9, top_p=0.9, seed=100 + i)
    return ask


@pytest.mark.parametrize("streams", [64, 200])
def test_many_concurrent_requests_equal_their_solo_runs(wide, streams):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=wide.url + "/v1", api_key="unused", max_retries=0, timeout=300)

    def sha(i: int) -> str:
        return client.completions.create(model="tiny", **_ask(i)).choices[0].token_sha

    solo = [sha(i) for i in range(streams)]
    with ThreadPoolExecutor(streams) as pool:
        together = list(pool.map(sha, range(streams)))
    assert together == solo
    running = wide.get("/health")[1]
    assert running["slots"] == 200
