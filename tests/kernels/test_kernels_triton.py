"""Triton EXL3 kernels (decode, fused GEMV/GEMM, MoE) against the references, under TRITON_INTERPRET=1.

The kernels run in one subprocess (this file run as a script) so that the interpreter flag, which Triton
reads at import, never leaks into other test modules of the pytest process. Inputs are random (never zero),
outputs are poisoned with NaN before every launch, and each case reports its measured error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

GEMM_CASES = [
    # (name, width, codebook, rows, k, dtype, config kwargs); n = 256
    ("m1_fused", 32, 2, 1, 256, "float16", {"fuse_rotation": True}),
    ("m1_split", 48, 0, 1, 256, "bfloat16", {"fuse_rotation": False, "split": 4}),
    # One row, integer widths: the 32-position run decode (exl3_runs) with 1, 2 and 4 tiles per element,
    # the input rotation fused or launched apart, every codebook, widths 1, 5, 6 and 8 bits.
    ("m1_runs_t1_w16", 16, 0, 1, 256, "float16", {"run_tiles": 1, "block_k": 32, "split": 2}),
    ("m1_runs_t2_w80", 80, 1, 1, 256, "bfloat16", {"run_tiles": 2, "fuse_rotation": False, "split": 2}),
    ("m1_runs_t4_w96", 96, 0, 1, 256, "float16", {"run_tiles": 4, "block_k": 128}),
    ("m1_runs_t4_w128", 128, 2, 1, 256, "bfloat16", {"run_tiles": 4, "block_k": 64, "split": 2}),
    ("m1_gather", 32, 2, 1, 256, "float16", {"runs": False, "fuse_rotation": True, "split": 2}),
    ("m1_gather_half_rate", 40, 2, 1, 256, "float16", {"block_k": 32, "split": 2}),
    # 2-16 rows, integer widths: the run decode with a row axis (the default up to 4 rows, asked for with
    # use_dot=False above; rows padded to a power of two repeat the last row), 1, 2 and 4 tiles per element,
    # every codebook, widths 2, 3, 4, 6 and 8 bits; k = 128 keeps the interpreter time down (two column
    # blocks and the k-split still exercised).
    ("m2_runs_t1_w32", 32, 0, 2, 128, "float16", {"run_tiles": 1, "block_k": 16, "split": 4}),
    ("m3_runs_default_w48", 48, 1, 3, 128, "bfloat16", {}),
    ("m4_runs_default_w64", 64, 2, 4, 128, "float16", {}),
    (
        "m5_runs_t4_w128",
        128,
        2,
        5,
        128,
        "float16",
        {"use_dot": False, "run_tiles": 4, "block_k": 64, "split": 2},
    ),
    ("m16_runs_w96", 96, 0, 16, 128, "bfloat16", {"use_dot": False}),
    ("m4_dot_fused", 24, 2, 4, 256, "float16", {"fuse_rotation": True, "split": 2}),
    ("m16_dot", 64, 1, 16, 256, "bfloat16", {"use_dot": True, "fuse_rotation": False, "split": 2}),
    # The k-split partials summed in a second launch, one program per (column block, row) (reduce_apart, the
    # mma decode's default from 2 rows), after the run decode and after the matrix units.
    ("m3_runs_apart", 48, 2, 3, 128, "float16", {"split": 4, "reduce_apart": True}),
    ("m16_dot_apart", 32, 0, 16, 256, "bfloat16", {"use_dot": True, "split": 2, "reduce_apart": True}),
    # ... loading reduce_flight partials at a time: more than the split (masked), and fewer (several rounds)
    ("m1_runs_apart_f32", 64, 2, 1, 256, "float16", {"split": 8, "reduce_apart": True, "reduce_flight": 32}),
    ("m2_runs_apart_f2", 64, 0, 2, 256, "float16", {"split": 8, "reduce_apart": True, "reduce_flight": 2}),
]
# Tolerances (relative Frobenius error against float64): the FMA paths (one row, and the run decode for any
# rows) are fp32 throughout: fp32 rotated input and fp32 accumulation, so only fp32 rounding remains (measured
# ~3e-7); the matrix-unit path rounds the rotated input to fp16 (2^-11), measured ~2e-4.
TOL_FMA, TOL_DOT = 1e-5, 1e-3


def _cases() -> dict[str, dict]:
    import numpy as np
    import torch
    from tfc.kernels import exl3_reference as ref
    from tfc.kernels.exl3_decode import exl3_decode
    from tfc.kernels.exl3_gemv import GemmConfig, counters, exl3_gemm, rotate_input, uses_matrix_units
    from tfc.kernels.expert_table import ExpertTable
    from tfc.kernels.moe_exl3 import MoeConfig, _moe_rotate_kernel, moe_exl3, moe_reference

    rng = np.random.default_rng(1234)
    results: dict[str, dict] = {}

    def group(k, n, width, cb):
        trellis = rng.integers(-32768, 32768, size=(k // 16, n // 16, width), dtype=np.int16)
        suh = (rng.standard_normal(k) * 0.05).astype(np.float16)
        svh = (rng.standard_normal(n) * 0.5).astype(np.float16)
        dense = torch.from_numpy(ref.dequant(trellis, suh, svh, cb))
        return (torch.from_numpy(trellis), torch.from_numpy(suh), torch.from_numpy(svh), cb), dense

    for width, cb in [(16, 0), (40, 2), (96, 1), (128, 2)]:
        (tr, suh, svh, _), dense = group(128, 256, width, cb)
        out = torch.full((128, 256), float("nan"), dtype=torch.float16)
        exl3_decode(tr, suh, svh, cb, rotated=True, out=out)
        want = ref.decode_rotated(tr.numpy(), cb).view(np.uint16)
        exact = bool((out.numpy().view(np.uint16) == want).all())
        full = torch.full((128, 256), float("nan"), dtype=torch.float32)
        exl3_decode(tr, suh, svh, cb, out=full)
        err = float((full.double() - dense.double()).abs().max() / dense.abs().max())
        results[f"decode_{width}_{cb}"] = {"exact": exact, "err": err, "finite": bool(full.isfinite().all())}

    for name, width, cb, rows, k, dtype, cfg in GEMM_CASES:
        (tr, suh, svh, _), dense = group(k, 256, width, cb)
        x = torch.randn(rows, k).to(getattr(torch, dtype))
        want = x.double() @ dense.double()
        outs = []
        for _ in range(2):
            y = torch.full((rows, 256), float("nan"), dtype=torch.float32)
            exl3_gemm(x, tr, suh, svh, cb, config=GemmConfig(**cfg), out=y)
            outs.append(y)
        err = float((outs[0].double() - want).norm() / want.norm())
        results[f"gemm_{name}"] = {
            "err": err,
            "tol": TOL_DOT if uses_matrix_units(GemmConfig(**cfg), rows, tr.shape) else TOL_FMA,
            "deterministic": bool(torch.equal(outs[0], outs[1])),
            "counters_zero": bool((counters(x.device, 1) == 0).all()),
        }
        if name == "m3_runs_default_w48":  # the same run with the input rotated beforehand (x_rotated)
            y = torch.full((rows, 256), float("nan"), dtype=torch.float32)
            exl3_gemm(rotate_input(x, suh, False), tr, suh, svh, cb, out=y, x_rotated=True)
            results[f"gemm_{name}"]["rotated_input_same"] = bool(torch.equal(y, outs[0]))
    results["gemm_defaults"] = {
        f"{rows}_{width}": GemmConfig().resolved(rows, width).__dict__
        for rows in (1, 4, 16)
        for width in (32, 40, 64)
    }
    results["gemm_defaults"]["1_96_head"] = GemmConfig().resolved(1, 96, 129280).__dict__

    for layout in ("stack", "ragged", "ragged_int"):
        d, inter, routed, topk, tokens = 128, 256, 4, 2, 2
        tables, dense = [], []
        for proj, (k, n) in enumerate([(d, inter), (d, inter), (inter, d)]):
            specs = []
            for e in range(routed + 1):
                if layout == "stack":
                    specs.append((32, 2))
                elif layout == "ragged_int":  # integer widths, one codebook: the run decode per width
                    specs.append(([32, 48, 64, 80, 128][e], 2))
                else:  # mixed widths (half rates on mul1) and, for w3, mixed codebooks
                    width = [24, 32, 48, 40, 64][e]
                    specs.append((width, 2 if width % 16 or proj != 1 else e % 3))
            gs = [group(k, n, w, c) for w, c in specs]
            tables.append(ExpertTable.build([g[0] for g in gs], layout=layout.removesuffix("_int")))
            dense.append([g[1] for g in gs])
        x = torch.randn(tokens, d).to(torch.float16)
        ids = torch.stack([torch.randperm(routed)[:topk] for _ in range(tokens)])
        wts = torch.rand(tokens, topk) + 0.1
        limit = 0.3
        want = moe_reference(x, ids, wts, *dense, swiglu_limit=limit)
        unclamped = moe_reference(x, ids, wts, *dense, swiglu_limit=0.0)
        if layout == "stack":  # the rotation's fp16 high / low pairs (MoeConfig.mma) against its fp32 output
            pairs, outs = tokens * (topk + 1), {}
            for split in (False, True):
                xh = torch.full((2, pairs, 2, d) if split else (2, pairs, d), float("nan"),
                                dtype=torch.float16 if split else torch.float32)  # fmt: skip
                _moe_rotate_kernel[(d // 128, pairs, 2)](
                    x, ids, tables[0].suh, tables[1].suh, xh, torch.empty(2, pairs, d), pairs, d, x.stride(0),
                    topk, routed, PAIRS=split,
                )  # fmt: skip
                outs[split] = xh
            hi, lo, f32 = outs[True][:, :, 0], outs[True][:, :, 1], outs[False]
            err = ((hi.double() + lo.double()) - f32.double()).abs().max() / f32.abs().max()
            results["moe_rotate_pairs"] = {
                "high_is_fp16": bool(torch.equal(hi, f32.half())),
                "err": float(err),
            }
        modes = (("rotate", {}), ("fused", {"fuse_rotation": True}))
        if layout == "stack":
            modes += (("gather", {"runs": False}), ("runs_t4", {"run_tiles": 4, "block_k": 128}))
            # k-splits that do not divide the k-tiles (8 / 3, 16 / 5): the counts differ by one, as the mma
            # decode's even_split gives them on the GPU
            modes += (("gather_uneven", {"runs": False, "block_k": 16, "split_gate_up": 3, "split_down": 5,
                                         "reduce_flight": 2}),)  # fmt: skip
        elif layout == "ragged_int":
            modes = (("runs", {}),)
        for mode, cfg in modes:
            y = torch.full((tokens, d), float("nan"), dtype=torch.float32)
            moe_exl3(x, ids, wts, *tables, swiglu_limit=limit, config=MoeConfig(**cfg), out=y)
            results[f"moe_{layout}_{mode}"] = {
                "err": float((y.double() - want).norm() / want.norm()),
                "clamp_matters": float((unclamped - want).norm() / want.norm()),
                "widths": tables[0].width,
                "codebook": tables[1].codebook,
                "integer_widths": tables[0].integer_widths,
            }
    return results


@pytest.fixture(scope="module")
def interp_results():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=900, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["decode_16_0", "decode_40_2", "decode_96_1", "decode_128_2"])
def test_decode_kernel(interp_results, case):
    r = interp_results[case]
    assert r["exact"], "rotated-domain decode differs from the reference bit pattern"
    assert r["finite"] and r["err"] < 1e-5


@pytest.mark.parametrize("case", [c[0] for c in GEMM_CASES])
def test_gemm_kernel(interp_results, case):
    r = interp_results[f"gemm_{case}"]
    assert r["err"] < r["tol"], r
    assert r["deterministic"] and r["counters_zero"]
    assert r.get("rotated_input_same", True)


def test_gemm_defaults(interp_results):
    d = interp_results["gemm_defaults"]
    # Integer widths take the run decode (fp32 FMAs) for 1 to RUN_ROWS_MAX (4) rows, two tiles per element for
    # several rows; the matrix units above that (measured as fast at 8 rows, faster at 16, on the H200).
    assert [(d[f"{r}_64"]["runs"], d[f"{r}_64"]["use_dot"]) for r in (1, 4, 16)] == [
        (True, False),
        (True, False),
        (False, True),
    ]
    assert [(d[f"{r}_64"]["block_k"], d[f"{r}_64"]["run_tiles"]) for r in (1, 4)] == [(32, 4), (16, 2)]
    # One row from 4 bits: one-warp programs, 32 per SM (more warps in flight); at 2-3 bits two-warp ones,
    # 8 per SM (measured faster on the routed shapes; kernels_h200.md run 11).
    assert (d["1_64"]["num_warps"], d["1_64"]["waves"]) == (1, 32.0)
    assert (d["1_32"]["block_k"], d["1_32"]["num_warps"], d["1_32"]["waves"]) == (64, 2, 8.0)
    # The input rotation is fused for one row except on very wide matrices (the head rotates once apart).
    assert d["1_32"]["fuse_rotation"] and not d["1_96_head"]["fuse_rotation"]
    assert (d["16_64"]["num_warps"], d["16_64"]["waves"]) == (4, 4.0)
    assert d["1_64"]["fuse_rotation"] and not d["4_64"]["fuse_rotation"]
    # Half-integer widths: the gather decode for one row, the matrix units for more.
    assert not d["1_40"]["runs"] and not d["1_40"]["use_dot"]
    assert not d["4_40"]["runs"] and d["4_40"]["use_dot"] and d["16_40"]["use_dot"]


def test_moe_rotation_pairs(interp_results):
    """The MoE input rotation as fp16 high / low pairs (the mma decode's input): the high part is the fp16
    rounding of the fp32 rotation and the pair sums back to it within ~2^-22."""
    r = interp_results["moe_rotate_pairs"]
    assert r["high_is_fp16"] and r["err"] < 1e-6, r


MOE_CASES = ["stack_rotate", "stack_fused", "stack_gather", "stack_gather_uneven", "stack_runs_t4"]
MOE_CASES += ["ragged_rotate", "ragged_fused", "ragged_int_runs"]


@pytest.mark.parametrize("case", MOE_CASES)
def test_moe_kernel(interp_results, case):
    r = interp_results[f"moe_{case}"]
    assert r["clamp_matters"] > 1e-2, "the test inputs must exercise the SwiGLU clamp"
    assert r["err"] < 1e-5, r
    if case.startswith("ragged_int"):
        assert r["widths"] == 0 and r["codebook"] == 2 and r["integer_widths"]  # run decode, width per entry
    elif case.startswith("ragged"):
        assert r["widths"] == 0 and r["codebook"] == -1  # mixed widths and codebooks: run-time paths
    else:
        assert r["widths"] == 32 and r["codebook"] == 2


if __name__ == "__main__":
    print(json.dumps(_cases()))
