"""The inline-PTX kernels compiled for sm_90 on the CPU (support/sm90_compile.py; skipped where a GPU runs them):
the MoE over ragged expert tables (groups of pairs, fixed-point sums too) and the row-free EXL3 GEMM at 1-64 rows
(up to 4 chunks of 16 rows a program, grouped products too) compile through ptxas with nothing spilled."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU compiles and runs these itself")


def _table(k: int, n: int, widths: list[int], gen):
    from tfc.kernels.exl3.expert_table import ExpertTable

    return ExpertTable.build(
        [(torch.randint(-32768, 32768, (k // 16, n // 16, w), dtype=torch.int16, generator=gen),
          torch.randn(k, generator=gen).half(), torch.randn(n, generator=gen).half(), 2) for w in widths],
        layout="ragged",
    )  # fmt: skip


def _no_spills(compiled: list, name: str) -> list[dict]:
    from support.sm90_compile import resources

    got = [resources(k) for n, k in compiled if n == name]
    assert got and all(r.get("STACK", 0) == 0 and r.get("LOCAL", 0) == 0 for r in got), got
    return got


def test_the_moe_compiles_for_sm90(monkeypatch):
    from support.sm90_compile import compile_only
    from tfc.kernels.exl3 import moe

    monkeypatch.setattr(moe, "num_sms", lambda device: 132)
    gen = torch.Generator().manual_seed(5)
    d, inter, routed, topk, tokens = 512, 256, 6, 3, 5
    widths = [32, 48, 64, 80, 32, 96, 96]
    w1, w3, w2 = (_table(k, n, widths, gen) for k, n in ((d, inter), (d, inter), (inter, d)))
    x = torch.randn(tokens, d).half()
    ids = torch.stack([torch.randperm(routed, generator=gen)[:topk] for _ in range(tokens)])
    with compile_only() as compiled:
        for fixed in (False, True):
            moe.moe_exl3(x, ids, torch.rand(tokens, topk), w1, w3, w2, fixed=fixed,
                         config=moe.MoeConfig(mma=2, split_gate_up=3, split_down=2))  # fmt: skip
    for name in ("_moe_order_kernel", "_moe_rotate_kernel", "_moe_gate_up_kernel", "_moe_down_kernel"):
        _no_spills(compiled, name)


@pytest.mark.parametrize(("rows", "live"), [(1, None), (16, 9), (24, None), (64, 33), (64, None)])
def test_the_row_free_gemm_compiles_for_sm90(monkeypatch, rows, live):
    from support.sm90_compile import compile_only
    from tfc.kernels.exl3 import gemv

    monkeypatch.setattr(gemv, "num_sms", lambda device: 132)
    gen = torch.Generator().manual_seed(rows)
    k, n, w = 512, 1024, 48
    config = gemv.GemmConfig(row_free=True)
    trellis = [
        torch.randint(-32768, 32768, (k // 16, n // 16, w), dtype=torch.int16, generator=gen)
        for _ in range(2)
    ]
    suh, svh = [torch.randn(k).half() for _ in range(2)], [torch.randn(n).half() for _ in range(2)]
    assert gemv.launch_rows(config, trellis[0].shape) == gemv.WIDE_ROWS
    groups = gemv.group_offsets(trellis, suh, svh)
    with compile_only() as compiled:
        gemv.exl3_gemm(torch.randn(rows, k).half(), trellis[0], suh[0], svh[0], 2, config=config, live=live)
        gemv.exl3_gemm(torch.randn(rows, 2 * k).half(), trellis[0], suh[0], svh[0], 2, config=config, live=live,
                       groups=groups)  # fmt: skip
    regs = _no_spills(compiled, "_exl3_gemm_kernel")
    assert all(r["REG"] <= 128 for r in regs), regs  # 4 programs of 4 warps fit an SM
