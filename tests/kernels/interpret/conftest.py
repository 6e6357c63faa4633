"""The Triton kernels under the CPU interpreter, in the suite's own process, one pytest test per case.

The tests here run a private copy of triton and tfc.kernels imported with TRITON_INTERPRET=1
(support/triton_interpret.py says why and how), swapped into sys.modules only while a test that asks for `tk`
runs; every other test (the GPU ones included) keeps native Triton, whatever order pytest runs them in.
test_triton_interpret.py checks both sides.
"""

from __future__ import annotations

import pytest

# The modules the tests use, by short name; their own imports of tfc.kernels.* and triton come along.
MODULES = ("exl3_reference", "exl3_decode", "exl3_gemv", "exl3_lanes", "exl3_scratch", "exl3_sums", "exl3_tl", "expert_table", "moe_exl3", "mhc_sinkhorn",
           "run_copy", "exl3_rotate", "exl3_rows", "exl3_fixed", "exl3_launch", "stage_tl", "kv_pack", "index_scores", "attend_keys", "attend_rows", "mhc_stages",
           "router_pick", "step_rows", "hidden_tap")  # fmt: skip


@pytest.fixture(scope="session")
def interpreted():
    """The interpreted copy, not swapped in (a test using only this sees the process's own modules)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from support.triton_interpret import Interpreted

    copy = Interpreted([f"tfc.kernels.{m}" for m in MODULES])
    yield copy
    copy.park()


@pytest.fixture()
def tk(interpreted):
    """The interpreted tfc.kernels modules by short name (tk.exl3_gemv, tk.moe_exl3, ...), swapped in for the test."""
    with interpreted.active():
        yield interpreted.namespace("tfc.kernels", MODULES)
