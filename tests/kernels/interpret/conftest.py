"""The Triton kernels under the CPU interpreter, in the suite's own process, one pytest test per case.

The tests here run a private copy of triton and tfc.kernels imported with TRITON_INTERPRET=1
(support/triton_interpret.py says why and how), swapped into sys.modules only while a test that asks for `tk`
runs; every other test (the GPU ones included) keeps native Triton, whatever order pytest runs them in.
test_triton_interpret.py checks both sides.
"""

from __future__ import annotations

import pytest

# The modules the tests use: short name -> module under tfc.kernels; their own imports of tfc.kernels.* and triton come along.
MODULES = {
    "exl3_reference": "exl3.reference",
    "exl3_decode": "exl3.decode",
    "exl3_gemv": "exl3.gemv",
    "exl3_lanes": "exl3.lanes",
    "exl3_scratch": "exl3.scratch",
    "exl3_sums": "exl3.sums",
    "exl3_tl": "exl3.tl",
    "expert_table": "exl3.expert_table",
    "moe_exl3": "exl3.moe",
    "moe_order": "exl3.moe_order",
    "mhc_sinkhorn": "dsv41.mhc_sinkhorn",
    "run_copy": "run_copy",
    "exl3_rotate": "exl3.rotate",
    "exl3_rows": "exl3.rows",
    "exl3_fixed": "exl3.fixed",
    "exl3_launch": "exl3.launch",
    "stage_tl": "dsv41.stage_tl",
    "kv_pack": "dsv41.kv_pack",
    "index_scores": "dsv41.index_scores",
    "attend_keys": "dsv41.attend_keys",
    "attend_rows": "dsv41.attend_rows",
    "mhc_stages": "dsv41.mhc_stages",
    "router_pick": "dsv41.router_pick",
    "step_rows": "dsv41.step_rows",
    "hidden_tap": "dsv41.hidden_tap",
}


@pytest.fixture(scope="session")
def interpreted():
    """The interpreted copy, not swapped in (a test using only this sees the process's own modules)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from support.triton_interpret import Interpreted

    copy = Interpreted([f"tfc.kernels.{m}" for m in MODULES.values()])
    yield copy
    copy.park()


@pytest.fixture()
def tk(interpreted):
    """The interpreted tfc.kernels modules by short name (tk.exl3_gemv, tk.moe_exl3, ...), swapped in for the test."""
    with interpreted.active():
        yield interpreted.namespace("tfc.kernels", MODULES)
