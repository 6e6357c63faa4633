"""The fast forward's ops (runtime/models/dsv41/fast/ops.py) as the prefill forward's twin: the MoE's path."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(("width", "scratch"), [(2048, False), (8192, True), (16384, True)])
def test_the_prefill_twins_moe_path_follows_its_step_width_not_its_live_rows(monkeypatch, width, scratch):
    """A wide prefill step's MoE decodes its tables into the scratch (kernels/exl3/rows.py,
    RowsConfig.moe_scratch_tokens), at every count of live rows: a prompt's last, short chunk keeps its width's
    path, so its bits."""
    from tfc.runtime.models.dsv41.fast.ops import TritonOps

    ops = TritonOps(torch.device("cpu"))
    twin = ops.for_prefill(width)
    assert twin.many_rows and not ops.many_rows
    seen = []
    monkeypatch.setattr(twin, "_moe_rows", lambda *a, **k: seen.append(k["scratch"]))
    tables = type("Tables", (), {"w1": None, "w3": None, "w2": None})()
    gen = torch.Generator().manual_seed(0)

    def moe(live: int) -> None:
        ids = torch.randint(0, 8, (live, 2), generator=gen)
        twin.moe(torch.randn(live, 8, generator=gen), ids, torch.rand(live, 2, generator=gen), tables, 0.0)

    for live in (1, 300, width):
        moe(live)
    assert seen == [scratch] * 3
