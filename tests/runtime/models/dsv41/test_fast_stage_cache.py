"""Compiled stages saved on disk (stage_cache.py): a restart loads them instead of tracing, the same bits."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from tfc.runtime.models.dsv41.fast import fusion, stage_cache

CHILD = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import torch
    import torch._dynamo.utils as du
    torch._dynamo.config.enable_aot_compile = False  # torch 2.11's default: fusion.enable must turn it on
    from tfc.runtime.models.dsv41.fast import compressed, fusion
    fusion.enable(True)
    fusion.use_stage_folder(Path(sys.argv[1]))
    g = torch.Generator().manual_seed(0)
    out = []
    for width in (1024, 2048):  # the dynamic dimension: one saved stage for both widths
        scores = torch.randn(16, width, generator=g)
        visible = torch.randint(1, width, (16,), generator=g)
        order, ok, made = compressed.select(scores, visible, 64, None, 4, 128, True)
        out.append([order.tolist(), ok.tolist(), made.tolist()])
    print(json.dumps({"out": out, "graphs": du.counters["stats"]["unique_graphs"], "notes": fusion.NOTES,
                      "counts": fusion.COUNTS}))
    """
)


def _child(folder) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_restart_loads_the_saved_stage_and_traces_nothing(tmp_path):
    first = _child(tmp_path)
    assert first["graphs"] >= 1 and not first["notes"] and len(list(tmp_path.glob("select-*.bin"))) == 1
    second = _child(tmp_path)
    assert second["graphs"] == 0 and not second["notes"]  # loaded: no dynamo trace in this process
    assert second["counts"] == {"loaded": 1, "saved": 0, "traced": 0, "kernels": 0}
    assert second["out"] == first["out"]


@pytest.fixture()
def saving(tmp_path):
    fusion.enable(True)
    fusion.use_stage_folder(tmp_path)
    yield tmp_path
    fusion.use_stage_folder(None)
    fusion.enable(False)


def test_a_stage_compiles_once_per_signature_and_saves_it(saving):
    def scaled(x: torch.Tensor, k: float) -> torch.Tensor:
        return x * k + 1

    stage = fusion.fused(scaled)
    x = torch.arange(4.0)
    before = dict(fusion.COUNTS)
    assert torch.equal(stage(x, 2.0), x * 2 + 1) and torch.equal(stage(x, 3.0), x * 3 + 1)
    assert len(list(saving.glob("*scaled-*.bin"))) == 2  # k is part of the signature
    again = fusion.fused(scaled)  # a fresh wrapper, as in a new process: loads
    assert torch.equal(again(x, 2.0), x * 2 + 1) and len(list(saving.glob("*.bin"))) == 2
    counted = {k: fusion.COUNTS[k] - before[k] for k in before}
    assert counted == {
        "loaded": 1,
        "saved": 2,
        "traced": 0,
        "kernels": 0,
    }  # what tfc serve's boot log reports


def test_a_damaged_file_is_compiled_again_over(saving):
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    x = torch.arange(3.0)
    assert torch.equal(fusion.fused(doubled)(x), x * 2)
    (path,) = saving.glob("*doubled-*.bin")
    path.write_bytes(b"not a compiled stage")
    before = dict(fusion.COUNTS)
    assert torch.equal(fusion.fused(doubled)(x), x * 2)  # a fresh wrapper: the load fails, it compiles
    assert fusion.COUNTS["saved"] == before["saved"] + 1 and path.read_bytes() != b"not a compiled stage"


def test_an_argument_that_keys_nothing_compiles_in_process_and_says_so(saving):
    @fusion.fused
    def listed(x: torch.Tensor, parts: list) -> torch.Tensor:
        return x * len(parts)

    before = len(fusion.NOTES)
    assert torch.equal(listed(torch.ones(2), [1, 2]), torch.full((2,), 2.0))
    assert "listed compiles in process" in fusion.NOTES[before] and not list(saving.glob("*.bin"))


def test_the_file_name_follows_the_sources_and_the_signature(monkeypatch, tmp_path):
    def f(x):
        return x

    key = stage_cache.call_key((torch.zeros(2, 8),), {}, {})
    a = stage_cache.stage_path(tmp_path, f, key)
    assert stage_cache.stage_path(tmp_path, f, stage_cache.call_key((torch.zeros(2, 9),), {}, {})) != a
    dyn = stage_cache.call_key((torch.zeros(2, 8),), {}, {0: 1})
    assert dyn == stage_cache.call_key((torch.zeros(2, 9),), {}, {0: 1})  # a dynamic dimension keys no size
    monkeypatch.setattr(stage_cache, "source_digest", lambda: "edited")
    assert stage_cache.stage_path(tmp_path, f, key) != a  # an edited stage never loads an old file


def test_another_thread_count_saves_its_own_stage_instead_of_tracing_at_every_start(saving):
    def shifted(x: torch.Tensor) -> torch.Tensor:
        return x + 3

    x, threads = torch.arange(5.0), torch.get_num_threads()
    assert torch.equal(fusion.fused(shifted)(x), x + 3)
    before, notes = dict(fusion.COUNTS), len(fusion.NOTES)
    torch.set_num_threads(threads + 1)  # another OMP_NUM_THREADS: the saved file's guards refuse it
    try:
        assert torch.equal(fusion.fused(shifted)(x), x + 3)
    finally:
        torch.set_num_threads(threads)
    assert len(fusion.NOTES) == notes  # not "compiles in process: ... GLOBAL_STATE changed: num_threads"
    assert fusion.COUNTS["saved"] == before["saved"] + 1 and fusion.COUNTS["traced"] == before["traced"]
    assert len(list(saving.glob("*shifted-*.bin"))) == 2
    assert torch.equal(fusion.fused(shifted)(x), x + 3) and fusion.COUNTS["loaded"] == before["loaded"] + 1
