"""The prefill's many-row EXL3 kernels (kernels/exl3/rows.py) at DeepSeek-V4.1-Flash's expert shapes on a CUDA
GPU (skipped without one): the tiles' lane decode against their window decode bit for bit, both against float64,
and each way of cutting a lane's states (exl3_lanes.CUTS) on both paths bit for bit;
the rotation kernel's in-place gathers against torch's gathered rotation bit for bit; the default products (the
rows' fp16 high halves alone, `LOW_HALF` off) against float64 on the rows rounded to fp16; the prefetching loop
and the tiles' own finish (both on by default) against the loop without them, bit for bit. Tests of the decodes
take both halves, whose fp32-level sums the tolerance below is for.

3e-5 relative to float64 bounds fp32-level sums over k = 5,120 on the matrix units (measured 1.2e-5 on an H100;
fp16 high / low input halves, fp32 sums and butterflies); a dropped half would show ~1e-4, a wrong column block
order 1.
"""

from __future__ import annotations

import pytest
from support.exl3_inputs import cuda_group

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
TOL = 3e-5


@pytest.fixture()
def tiles_only(monkeypatch):
    """The module with every product on the tiles (the scratch off) and both input halves (fp32-level sums),
    restored after the test."""
    from tfc.kernels.exl3 import rows as exl3_rows

    monkeypatch.setattr(exl3_rows, "SCRATCH", "none")
    monkeypatch.setattr(exl3_rows, "LOW_HALF", True)
    return exl3_rows


def _ragged_moe(d: int, inter: int, bits: list, codebook: int, seed: int):
    """A ragged MoE on the GPU: (tables, x, ids, weights) for 12 routed experts at `bits`, a shared one last."""
    from tfc.kernels.exl3.expert_table import ExpertTable

    routed, topk, tokens = len(bits) - 1, 6, 70
    tables = []
    for proj, (k, n) in enumerate([(d, inter), (d, inter), (inter, d)]):
        groups = [cuda_group(k, n, b, codebook, seed + 100 * proj + e) for e, b in enumerate(bits)]
        tables.append(ExpertTable.build(groups, layout="ragged"))
    x = torch.randn(tokens, d, device="cuda")
    ids = torch.stack([torch.randperm(routed)[:topk] for _ in range(tokens)]).cuda()
    return tables, x, ids, torch.rand(tokens, topk, device="cuda") + 0.05


@pytest.mark.parametrize(
    ("k", "n", "bits", "codebook"), [(5120, 2304, 3, 0), (2304, 5120, 2.5, 2), (5120, 2304, 6, 1)]
)
def test_the_tiles_lane_decode_gives_the_window_decodes_bits(tiles_only, monkeypatch, k, n, bits, codebook):
    from tfc.kernels.exl3 import lanes as exl3_lanes
    from tfc.kernels.exl3.decode import exl3_decode

    tr, suh, svh, cb = cuda_group(k, n, bits, codebook, 11)
    x = torch.randn(150, k, device="cuda")
    lanes = tiles_only.exl3_gemm_rows(x, tr, suh, svh, cb)
    monkeypatch.setattr(tiles_only, "SCRATCH", "all")
    scratch = tiles_only.exl3_gemm_rows(x, tr, suh, svh, cb)
    for cut in exl3_lanes.CUTS:  # the states cut from 64-bit pairs and at constexpr bits
        monkeypatch.setattr(exl3_lanes, "LANE_CUT", cut)
        assert torch.equal(tiles_only.exl3_gemm_rows(x, tr, suh, svh, cb), scratch), f"scratch, {cut}"
        monkeypatch.setattr(tiles_only, "SCRATCH", "none")
        assert torch.equal(tiles_only.exl3_gemm_rows(x, tr, suh, svh, cb), lanes), f"tiles, {cut}"
        monkeypatch.setattr(tiles_only, "SCRATCH", "all")
    monkeypatch.setattr(tiles_only, "SCRATCH", "none")
    monkeypatch.setattr(tiles_only, "TILE_DECODE", "windows")
    assert torch.equal(tiles_only.exl3_gemm_rows(x, tr, suh, svh, cb), lanes)
    want = x.double() @ exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
    assert float((lanes.double() - want).norm() / want.norm()) < TOL


def test_the_moes_tiles_lane_decode_gives_the_window_decodes_bits_over_a_ragged_table(
    tiles_only, monkeypatch
):
    import numpy as np

    bits = [*np.random.default_rng(3).choice([2, 2.5, 3, 4], size=12).tolist(), 6]
    tables, x, ids, wts = _ragged_moe(5120, 2304, bits, 2, 0)
    from tfc.kernels.exl3 import lanes as exl3_lanes

    lanes = tiles_only.moe_rows(x, ids, wts, *tables, swiglu_limit=10.0, scratch=False)
    scratch = tiles_only.moe_rows(x, ids, wts, *tables, swiglu_limit=10.0, scratch=True)
    assert float((lanes - scratch).norm() / scratch.norm()) < TOL, "the two paths sum in other orders only"
    for cut in exl3_lanes.CUTS:  # the states cut from 64-bit pairs and at constexpr bits
        monkeypatch.setattr(exl3_lanes, "LANE_CUT", cut)
        assert torch.equal(
            tiles_only.moe_rows(x, ids, wts, *tables, swiglu_limit=10.0, scratch=False), lanes
        ), cut
        assert torch.equal(
            tiles_only.moe_rows(x, ids, wts, *tables, swiglu_limit=10.0, scratch=True), scratch
        ), cut
    monkeypatch.setattr(tiles_only, "TILE_DECODE", "windows")
    assert torch.equal(tiles_only.moe_rows(x, ids, wts, *tables, swiglu_limit=10.0, scratch=False), lanes)


def test_the_rotation_kernel_reads_gathered_rows_and_signs_in_place():
    from tfc.kernels.exl3 import rows as exl3_rows

    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(70, 5120, device="cuda", generator=gen).bfloat16()
    signs = torch.randint(0, 2, (13, 5120), device="cuda", generator=gen).half() * 2 - 1
    rows = torch.randint(0, 70, (420,), device="cuda", generator=gen)
    entries = torch.sort(torch.randint(0, 13, (420,), device="cuda", generator=gen)).values
    got = exl3_rows.rotate_rows(x, signs, rows, entries)
    want = exl3_rows.split_halves(exl3_rows.fwht128_rows(x[rows].float() * signs[entries].float()))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("scratch", ["all", "none"])
def test_the_default_products_take_the_rows_rounded_to_fp16(monkeypatch, scratch):
    from tfc.kernels.exl3 import rotate as exl3_rotate
    from tfc.kernels.exl3 import rows as exl3_rows
    from tfc.kernels.exl3.decode import exl3_decode

    monkeypatch.setattr(exl3_rows, "SCRATCH", scratch)
    assert not exl3_rows.LOW_HALF, "the default: the high halves alone"
    tr, suh, svh, cb = cuda_group(5120, 2304, 3, 0, 12)
    x = torch.randn(150, 5120, device="cuda")
    got = exl3_rows.exl3_gemm_rows(x, tr, suh, svh, cb)
    want = (
        exl3_rotate.rows_seen(x, suh, low=False).double()
        @ exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
    )
    assert float((got.double() - want).norm() / want.norm()) < TOL


@pytest.mark.parametrize("option", ["TILE_PREFETCH", "FINISH_IN_TILES"])
@pytest.mark.parametrize("scratch", ["dense", "none"])
def test_the_prefetching_loop_and_the_tiles_own_finish_keep_the_bits(monkeypatch, option, scratch):
    """Each option (on by default) against the loop without it, on the default's other settings."""
    import numpy as np
    from tfc.kernels.exl3 import rows as exl3_rows

    monkeypatch.setattr(exl3_rows, "SCRATCH", scratch)
    tr, suh, svh, cb = cuda_group(5120, 2304, 4, 2, 13)
    x = torch.randn(150, 5120, device="cuda")
    bits = [*np.random.default_rng(4).choice([2, 3, 4, 6], size=12).tolist(), 5]
    tables, xm, ids, wts = _ragged_moe(2048, 1024, bits, 1, 50)

    def both():
        return exl3_rows.exl3_gemm_rows(x, tr, suh, svh, cb), exl3_rows.moe_rows(xm, ids, wts, *tables, 10.0)

    assert getattr(exl3_rows, option), "on by default"
    monkeypatch.setattr(exl3_rows, option, False)
    want = both()
    monkeypatch.setattr(exl3_rows, option, True)
    assert all(torch.equal(a, b) for a, b in zip(both(), want, strict=True))
