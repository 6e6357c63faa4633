"""Programmatic dependent launch (kernels/pdl.py): its modes, where it is off, and the rule that keeps it exact.

A kernel launched with PDL may start before the kernel ahead of it has finished, so each participating kernel
must wait (`wait_prior(PDL)`) before any load or store: here every Triton kernel with a PDL parameter is read
and its first statement (after the docstring) must be that wait, and every kernel a decode step launches must
take part. The bits under each mode on a GPU: tests/runtime/models/dsv41/test_fast_gpu.py.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap

import pytest
import torch
from tfc.kernels import pdl

MODULES = ("attend_rows", "engram_rows", "exl3_gemv", "exl3_sums", "index_scores", "kv_pack", "mhc_sinkhorn",
           "mhc_stages", "moe_exl3", "router_pick")  # fmt: skip
DECODE_KERNELS = {
    "attend_rows": {"_partial_kernel", "_fold_kernel"},
    "exl3_gemv": {"_rotate_kernel", "_exl3_gemm_kernel"},
    "exl3_sums": {"reduce_kernel"},
    "index_scores": {"_scores_kernel"},
    "kv_pack": {"_row_kernel", "_entry_kernel", "_query_kernel", "_pooled_kernel"},
    "mhc_sinkhorn": {"_sinkhorn_kernel"},
    "mhc_stages": {"_rms_norm_kernel", "_collapse_norm_kernel", "_hc_expand_kernel", "_mix_partial_kernel",
                   "_mix_epilogue_kernel", "_engram_gate_kernel", "_rope_heads_kernel"},
    "moe_exl3": {"_moe_rotate_kernel", "_moe_gate_up_kernel", "_moe_down_kernel"},
    "router_pick": {"_split3_kernel", "_pick_kernel", "_select_kernel"},
}  # fmt: skip


def _kernels(module) -> dict:
    """The module's Triton kernels by name (JIT functions that are launched: those whose name ends in kernel)."""
    return {n: f for n, f in vars(module).items() if hasattr(f, "fn") and n.endswith("kernel")}


@pytest.mark.parametrize(
    ("env", "mode"),
    [({}, "wait"), ({"TFC_PDL": "0"}, "off"), ({"TFC_PDL": "off"}, "off"), ({"TFC_PDL": " Early "}, "early"),
     ({"TFC_PDL": "1"}, "wait"), ({"TFC_PDL": "wait"}, "wait")],
)  # fmt: skip
def test_the_mode_is_read_from_tfc_pdl(env, mode):
    assert pdl.mode_of(env) == mode


def test_no_pdl_off_a_gpu_or_when_switched_off(monkeypatch):
    assert pdl.pdl_args(torch.device("cpu")) == {}
    monkeypatch.setattr(pdl, "MODE", "off")
    assert pdl.pdl_args(torch.device("cuda", 0)) == {}


@pytest.mark.parametrize("name", MODULES)
def test_every_participating_kernel_waits_before_anything_else(name):
    module = importlib.import_module(f"tfc.kernels.{name}")
    taking_part = {n for n, f in _kernels(module).items() if "PDL" in f.arg_names}
    assert DECODE_KERNELS.get(name, set()) <= taking_part
    for kernel in taking_part:
        fn = _kernels(module)[kernel].fn
        body = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0].body
        if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        first = body[0]
        assert isinstance(first, ast.Expr) and ast.unparse(first) == "wait_prior(PDL)", kernel
