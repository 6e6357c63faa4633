"""Stages kept as AOTInductor packages (stage_aoti.py): a restart loads them through torch's C++ loader without
importing torch.compile's stack, gives the first start's bits, and a size outside a package's range compiles
another rather than running a shape the package was not built for."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from tfc.runtime.models.dsv41.fast import compressed, fusion, stage_aoti

pytestmark = pytest.mark.skipif(not stage_aoti.available(), reason="this torch has no AOTInductor loader")

CHILD = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    import torch
    from tfc.runtime.models.dsv41.fast import compressed, fusion
    fusion.enable(True)
    fusion.use_stage_folder(Path(sys.argv[1]))
    g = torch.Generator().manual_seed(0)
    out = []
    for width in (1024, 2048):  # the dynamic dimension: one package for both widths
        scores = torch.randn(16, width, generator=g)
        visible = torch.randint(1, width, (16,), generator=g)
        order, ok, made = compressed.select(scores, visible, 64, None, 4, 128, True)
        with fusion.eager():
            plain = compressed.select(scores, visible, 64, None, 4, 128, True)
        out.append([order.tolist(), ok.tolist(), made.tolist(), all(torch.equal(a, b) for a, b in
                    zip((order, ok, made), plain))])
    print(json.dumps({"out": out, "notes": fusion.NOTES, "counts": fusion.COUNTS,
                      "dynamo": "torch._dynamo" in sys.modules, "inductor": "torch._inductor" in sys.modules}))
    """
)


def _child(folder) -> dict:
    env = {**__import__("os").environ, "TFC_STAGE_AOTI": "1"}
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)], capture_output=True, text=True, timeout=600, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_a_restart_loads_the_package_without_torch_compiles_stack(tmp_path):
    first = _child(tmp_path)
    assert not first["notes"] and first["counts"] == {"loaded": 0, "saved": 1, "traced": 0}
    assert len(list(tmp_path.glob("select-*.pt2"))) == 1 and len(list(tmp_path.glob("select-*.json"))) == 1
    assert all(width[3] for width in first["out"])  # the package's picks are eager's
    second = _child(tmp_path)
    assert second["counts"] == {"loaded": 1, "saved": 0, "traced": 0} and not second["notes"]
    assert not second["dynamo"] and not second["inductor"]  # the C++ loader alone
    assert second["out"] == first["out"]


def test_a_size_outside_the_packages_range_compiles_another(tmp_path, monkeypatch):
    monkeypatch.setenv("TFC_STAGE_AOTI", "1")
    fusion.enable(True)
    fusion.use_stage_folder(tmp_path)
    try:
        g = torch.Generator().manual_seed(1)
        before = dict(fusion.COUNTS)
        for width in (256, 32):  # 256 >= k exports as [k, inf); 32 pads to k: a branch of its own
            scores = torch.randn(4, width, generator=g)
            visible = torch.randint(1, width, (4,), generator=g)
            got = compressed.select(scores, visible, 64, None, 4, 16, False)
            with fusion.eager():
                plain = compressed.select(scores, visible, 64, None, 4, 16, False)
            assert torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1]) and got[2] is None
        assert fusion.COUNTS["saved"] - before["saved"] == 2 and not fusion.NOTES
        ranges = sorted(json.loads(p.read_text())["ranges"][0][3:] for p in tmp_path.glob("select-*.json"))
        assert ranges[0][1] is not None and ranges[0][1] < 64 and ranges[1] == [64, None]
    finally:
        fusion.use_stage_folder(None)
        fusion.enable(False)


def test_a_calls_tensors_put_back_together():
    class Grid:
        def __init__(self):
            self.codes, self.values = torch.arange(3), torch.ones(2)

    grid, x = Grid(), torch.zeros(2, 5)
    leaves = stage_aoti._Leaves((x, 3, grid), {"flag": True}, {0: 1})
    assert len(leaves.tensors) == 3 and leaves.dims == {0: 1}
    swapped = [t + 1 for t in leaves.tensors]
    args, kwargs = leaves.rebuild(tuple(swapped))
    assert args[0] is swapped[0] and args[1] == 3 and kwargs == {"flag": True}
    assert args[2] is not grid and args[2].codes is swapped[1] and args[2].values is swapped[2]
