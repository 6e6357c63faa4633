"""The fast forward's kernel calls under the Triton CPU interpreter, on the tiny image's own arena views.

`TritonOps` hands the kernels the arena's segments as they lie (EXL3 groups of every codebook, integer and
half-rate widths, the head; a ragged expert table of mixed and half-rate widths; the Engram row shard); its
results must match
the kernels' torch references (`ReferenceOps`) that the CPU forward tests run on. TRITON_INTERPRET is read
when triton and tfc.kernels are imported, so the check runs in a child process with it set, kept tiny: the
interpreted MoE takes layer 2's table (the gather decode, seconds; the run decode of integer-width tables
takes minutes interpreted and the GPU's mma decode cannot run there: tests/kernels covers both). Tolerances
are the kernels' own: 16 rows go through the matrix units on fp16 rotated inputs (relative 2e-3), the MoE's
decode in fp32 (1e-4), the gather exactly; the checks' dense decode on the device (dense_check.py) 1e-5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.dsv41_image import prepared_image

pytestmark = pytest.mark.slow

CHILD = r"""
import json, sys
import torch
from tfc.runtime.boot.rank import boot
from tfc.runtime.models.dsv41.config import config_from_dict
from tfc.runtime.models.dsv41.fast.ops import TritonOps, moe_config
from tfc.runtime.models.dsv41.fast.ops_reference import ReferenceOps
from tfc.runtime.models.dsv41.fast.weights import FastWeights
from tfc.kernels.exl3.tl import INTERPRET

booted = boot(sys.argv[1], device="cpu")
meta = booted.image.manifest.meta
cfg = config_from_dict(meta["pack_config"], meta["layer_modes"])
w = FastWeights(booted.image, booted.arena, cfg)
ops, ref = TritonOps(torch.device("cpu")), ReferenceOps()
gen = torch.Generator().manual_seed(0)
out = {"interpret": INTERPRET, "linear": {}, "moe": {}}
for name in ("layers.0.attn.wkv", "layers.1.attn.wq_a", "layers.2.attn.wo_b", "layers.4.attn.indexer.wk", "head"):
    lin = w.linear(name)
    x = torch.randn(16, lin.k, generator=gen)
    got, want = ops.linear(x, lin), ref.linear(x, lin)
    out["linear"][name] = [float((got - want).abs().max() / want.abs().max()), lin.codebook, int(lin.trellis.shape[-1])]
lins = [w.linear(f"layers.1.attn.wo_a.slice.{g}") for g in range(cfg.o_groups)]
x = torch.randn(16, cfg.o_groups * lins[0].k, generator=gen)
got = ops.linear_groups(x, lins)
alone = torch.cat([ops.linear(x[:, g * lins[0].k : (g + 1) * lins[0].k], lin) for g, lin in enumerate(lins)], -1)
want = ref.linear_groups(x, lins)
out["wo_a_groups"] = [bool(torch.equal(got, alone)), float((got - want).abs().max() / want.abs().max()),
                      ops._groups[tuple(lin.name for lin in lins)] is not None]
for layer in (2,):
    tables = w.experts(f"layers.{layer}")
    x = torch.randn(2, cfg.hidden_size, generator=gen)
    ids = torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[:cfg.num_experts_per_tok] for _ in range(2)])
    wts = torch.rand(2, cfg.num_experts_per_tok, generator=gen) + 0.1
    got, want = ops.moe(x, ids, wts, tables, cfg.swiglu_limit), ref.moe(x, ids, wts, tables, cfg.swiglu_limit)
    cfg_moe = moe_config(tables, cfg.num_experts_per_tok, torch.device("cpu"), True)
    out["moe"][layer] = [float((got - want).abs().max() / want.abs().max()), tables.w1.layout, cfg_moe.mma,
                         sorted(set(tables.w1.width_set) | set(tables.w2.width_set))]
table, lo = w.engram_table(cfg.engram_layer_ids[0], 0)
ids = torch.randint(lo, lo + table.shape[0], (4, cfg.engram_cols), generator=gen)
out["engram_equal"] = bool(torch.equal(ops.engram_rows(table, ids, cfg.engram_head_dim, lo),
                                       ref.engram_rows(table, ids, cfg.engram_head_dim, lo)))
from support.dense_check import DeviceDense
dense, tables = DeviceDense(w), w.experts("layers.2")
pairs = [(dense["layers.2.attn.wkv"], ref.dense(w.linear("layers.2.attn.wkv"))),
         (dense["layers.2.ffn.experts.1.w2"], ref.expert(tables.w2, 1)),
         (dense["layers.2.ffn.shared_experts.w1"], ref.expert(tables.w1, tables.w1.entries - 1))]
out["dense"] = [float((a - b).abs().max() / b.abs().max()) for a, b in pairs]
out["dense_native"] = bool(dense["layers.2.ffn.gate.bias"].data_ptr() == w.native("layers.2.ffn.gate.bias").data_ptr())
out["dense_missing"] = "layers.2.ffn.experts.8.w1" not in dense and "layers.2.nothing" not in dense
from types import SimpleNamespace
from support.dense_check import kernel_errors
out["kernel_errors"] = kernel_errors(SimpleNamespace(forward=SimpleNamespace(weights=w, ops=ops, cfg=cfg)), 2)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def image(tiny_pack, tmp_path_factory):
    return prepared_image(tiny_pack, tmp_path_factory.mktemp("img"))


def test_kernel_calls_on_the_arena_views_match_their_references_interpreted(image):
    pytest.importorskip("triton")
    tests = str(Path(__file__).resolve().parents[3])  # the child imports support.* as the suite does
    path = os.pathsep.join(filter(None, [tests, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    run = subprocess.run([sys.executable, "-c", CHILD, str(image)], env=env, capture_output=True, text=True,
                         timeout=900)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["interpret"]
    widths = {v[2] for v in got["linear"].values()}
    assert (
        {v[1] for v in got["linear"].values()} == {0, 1, 2} and 40 in widths and 128 in widths
    )  # codebooks, 2.5 and 8 bits
    for name, (err, _, _) in got["linear"].items():
        assert err < 2e-3, name
    # a layer's wo_a groups in one grouped launch on their arena views: each group's bits as its own launch
    same, err, grouped = got["wo_a_groups"]
    assert same and grouped and err < 2e-3, got["wo_a_groups"]
    err, layout, mma, moe_widths = got["moe"]["2"]
    assert (
        layout == "ragged" and mma == 0 and 40 in moe_widths and 96 in moe_widths
    )  # 2.5-bit routed, 6-bit shared
    assert err < 1e-4
    assert got["engram_equal"]
    # the checks' dense decode on the device (Triton): a group, a routed and the shared expert entry
    assert max(got["dense"]) < 1e-5 and got["dense_native"] and got["dense_missing"]
    # the GPU runs' localising diagnostic, on layer 2 (compressor, indexer, Engram wkv, wo_a groups) and the head
    errs = got["kernel_errors"]
    assert (
        sum(k.startswith("gemm ") for k in errs) == 14  # 13 groups (4 wo_a) + the head
        and "gemm head" in errs
        and "decode layers.2.attn.wkv" in errs
    )
    assert all(v < 2e-3 for k, v in errs.items() if k.startswith("gemm ")), errs
    assert all(v < 1e-5 for k, v in errs.items() if k.startswith("decode ")), errs
    assert errs["moe"] < 1e-4 and errs["router"] < 1e-5, errs
