"""The prefill's many-row EXL3 kernels (kernels/exl3/rows.py) at DeepSeek-V4.1-Flash's expert shapes on a CUDA
GPU (skipped without one): the tiles and the decoded scratch against float64 on the rows their fp16 input stands
for, and against each other over a ragged table's MoE; the rotation kernel's in-place gathers against torch's
gathered rotation bit for bit.

3e-5 relative to float64 bounds fp32-level sums over k = 5,120 on the matrix units (measured 1.2e-5 on an H100;
fp32 sums and butterflies); a wrong column block would show order 1.
"""

from __future__ import annotations

import pytest
from support.exl3_inputs import cuda_group

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
TOL = 3e-5


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
def test_the_tiles_and_the_scratch_match_float64_on_the_rows_rounded_to_fp16(k, n, bits, codebook):
    from tfc.kernels.exl3 import rows as exl3_rows
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.rotate import rotated_rows, rows_seen

    tr, suh, svh, cb = cuda_group(k, n, bits, codebook, 11)
    x = torch.randn(150, k, device="cuda")
    one = torch.zeros(1, dtype=torch.int64, device="cuda")
    tiles = exl3_rows.launch_rows(
        rotated_rows(x, suh), tr.contiguous().view(torch.int32).reshape(-1), one,
        torch.full((1,), tr.shape[-1], dtype=torch.int32, device="cuda"), one.int() + cb, svh,
        exl3_rows.dense_tiles(150, x.device), n, (tr.shape[-1],), cb, torch.empty(150, n, device="cuda"),
    )  # fmt: skip
    scratch = exl3_rows.exl3_gemm_rows(x, tr, suh, svh, cb)
    want = rows_seen(x, suh).double() @ exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
    for got in (tiles, scratch):
        assert float((got.double() - want).norm() / want.norm()) < TOL


def test_the_moes_tiles_and_scratch_agree_over_a_ragged_table():
    import numpy as np
    from tfc.kernels.exl3 import rows as exl3_rows

    bits = [*np.random.default_rng(3).choice([2, 2.5, 3, 4], size=12).tolist(), 6]
    tables, x, ids, wts = _ragged_moe(5120, 2304, bits, 2, 0)
    tiles = exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=10.0, scratch=False)
    scratch = exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=10.0, scratch=True)
    assert float((tiles - scratch).norm() / scratch.norm()) < TOL, "the two paths sum in other orders only"


def test_the_rotation_kernel_reads_gathered_rows_and_signs_in_place():
    from tfc.kernels.exl3 import rotate as exl3_rotate

    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(70, 5120, device="cuda", generator=gen).bfloat16()
    signs = torch.randint(0, 2, (13, 5120), device="cuda", generator=gen).half() * 2 - 1
    rows = torch.randint(0, 70, (420,), device="cuda", generator=gen)
    entries = torch.sort(torch.randint(0, 13, (420,), device="cuda", generator=gen)).values
    got = exl3_rotate.rotate_rows(x, signs, rows, entries)
    want = exl3_rotate.scaled_fp16(exl3_rotate.fwht128_rows(x[rows].float() * signs[entries].float()))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
