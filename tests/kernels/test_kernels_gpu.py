"""EXL3 kernels against the references at DeepSeek-V4.1-Flash shapes on a CUDA GPU (skipped without one)."""

from __future__ import annotations

import numpy as np
import pytest
from support.exl3_inputs import cuda_group, pooled_groups

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu
_group = cuda_group


@pytest.mark.parametrize(
    ("k", "n", "bits", "codebook"), [(5120, 2304, 2, 2), (2304, 5120, 3, 0), (5120, 512, 2.5, 2)]
)
def test_decode_matches_reference(k, n, bits, codebook):
    from tfc.kernels.exl3 import reference as ref
    from tfc.kernels.exl3.decode import exl3_decode

    tr, suh, svh, cb = _group(k, n, bits, codebook, 1)
    out = torch.full((k, n), float("nan"), dtype=torch.float16, device="cuda")
    exl3_decode(tr, suh, svh, cb, rotated=True, out=out)
    want = ref.decode_rotated(tr.cpu().numpy(), cb)
    assert (out.cpu().numpy().view(np.uint16) == want.view(np.uint16)).all()
    full = torch.full((k, n), float("nan"), dtype=torch.float32, device="cuda")
    exl3_decode(tr, suh, svh, cb, out=full)
    dense = ref.dequant(tr.cpu().numpy(), suh.cpu().numpy(), svh.cpu().numpy(), cb)
    assert np.abs(full.cpu().numpy() - dense).max() <= 1e-5 * np.abs(dense).max()


@pytest.mark.parametrize("rows", [1, 4, 8, 16])
@pytest.mark.parametrize(
    ("k", "n", "bits"), [(5120, 2304, 2), (2304, 5120, 3), (8192, 5120, 4), (1280, 32768, 4)]
)
def test_gemm_matches_reference(rows, k, n, bits):
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.gemv import GemmConfig, exl3_gemm, uses_matrix_units

    tr, suh, svh, cb = _group(k, n, bits, 2, 2)
    w = exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    want = x.double() @ w
    out = torch.full((rows, n), float("nan"), dtype=torch.float32, device="cuda")
    exl3_gemm(x, tr, suh, svh, cb, out=out)
    err = float((out.double() - want).norm() / want.norm())
    assert err < (2e-3 if uses_matrix_units(GemmConfig(), rows, tr.shape) else 1e-5)
    again = exl3_gemm(x, tr, suh, svh, cb, out_dtype=torch.float32)
    assert torch.equal(again, out), "split-k reduction must be deterministic"


@pytest.mark.parametrize("rows", [4, 16])
@pytest.mark.parametrize("mode", ["runs", "runs_rotated", "dot"])
def test_gemm_rows_flash(rows, mode):
    """Several rows at the routed w1 shape: the run decode (default, fp32) and the matrix units (fp16 input)."""
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.gemv import GemmConfig, exl3_gemm, rotate_input, uses_matrix_units

    k, n = 5120, 2304
    tr, suh, svh, cb = _group(k, n, 3, 0, 3)
    cfg = GemmConfig(use_dot=mode == "dot")
    assert uses_matrix_units(cfg, rows, tr.shape) == (mode == "dot")
    w = exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    want = x.double() @ w
    xin = rotate_input(x, suh, False) if mode == "runs_rotated" else x
    outs = []
    for _ in range(2):
        out = torch.full((rows, n), float("nan"), dtype=torch.float32, device="cuda")
        exl3_gemm(xin, tr, suh, svh, cb, config=cfg, out=out, x_rotated=mode == "runs_rotated")
        outs.append(out)
    err = float((outs[0].double() - want).norm() / want.norm())
    assert err < (2e-3 if mode == "dot" else 1e-5), err
    assert torch.equal(outs[0], outs[1]), "split-k reduction must be deterministic"


@pytest.mark.parametrize("wt", [False, True], ids=["x_as_a", "weights_as_a"])
@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize(("bits", "groups"), [(3, 1), (6, 2), (4, 4)])
def test_gemm_mma_flash(rows, bits, groups, wt):
    """The weights decoded into mma from registers (GemmConfig.mma; mma_wt: as the A operand): 1-16 rows at
    the routed shapes."""
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.gemv import GemmConfig, exl3_gemm, rotate_for, uses_matrix_units

    k, n = (5120, 2304) if bits != 6 else (2304, 5120)
    tr, suh, svh, cb = _group(k, n, bits, 2 if bits != 4 else 0, bits)
    w = exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    want = x.double() @ w
    cfg = GemmConfig(mma=groups, mma_wt=wt)
    outs = []
    for rotated in (False, False, True):
        out = torch.full((rows, n), float("nan"), dtype=torch.float32, device="cuda")
        xin = rotate_for(x, suh, cfg, tr.shape) if rotated else x
        exl3_gemm(xin, tr, suh, svh, cb, config=cfg, out=out, x_rotated=rotated)
        outs.append(out)
    err = float((outs[0].double() - want).norm() / want.norm())
    # fp16 rotated input (2^-11) as on the other matrix-unit path; weights as A from 1 to 4 rows carry it as
    # fp16 high / low pairs (~2^-22), so the fp32 paths' tolerance holds there.
    assert err < (2e-3 if uses_matrix_units(cfg, rows, tr.shape) else 1e-5), err
    assert wt == (not uses_matrix_units(cfg, rows, tr.shape)) or rows > 4
    assert torch.equal(outs[0], outs[1]), "split-k reduction must be deterministic"
    assert torch.equal(outs[0], outs[2]), "the pre-rotated input (rotate_for) must give the same sums"


@pytest.mark.parametrize("rows", [1, 4, 16])
@pytest.mark.parametrize("cfg", [{}, {"mma": 0, "use_dot": True}], ids=["default", "dot"])
def test_gemm_grouped_flash_wo_a(rows, cfg):
    """Eight wo_a groups (4096 -> 1024, 4 bit) in one grouped launch, their views in one buffer at their own
    offsets: each group's bits as its own exl3_gemm with the same config (the run decode with its fused rotation
    at one row, the mma decode above, the matrix units), x read as column slices of the attention output."""
    from tfc.kernels.exl3.gemv import GemmConfig, exl3_gemm, group_offsets

    k, n, ng = 4096, 1024, 8
    made = [_group(k, n, 4, 0, 100 + g) for g in range(ng)]
    words = made[0][0].numel()
    pool = torch.zeros(ng * (words + 2 * 4096), dtype=torch.int16, device="cuda")
    views = []
    for g, (tr, suh, svh, _) in enumerate(made):
        at = (ng - 1 - g) * (words + 2 * 4096) + 2048 * (g % 3)  # reversed order, uneven gaps
        t = pool[at : at + words].view(tr.shape)
        su = pool[at + words : at + words + k].view(torch.float16)
        sv = pool[at + words + k : at + words + k + n].view(torch.float16)
        t.copy_(tr), su.copy_(suh), sv.copy_(svh)
        views.append((t, su, sv))
    out = torch.randn(rows, 64 * 512, device="cuda")
    config = GemmConfig(**cfg)
    offsets = group_offsets(*([v[i] for v in views] for i in range(3)))
    got = exl3_gemm(out, *views[0], 0, out_dtype=torch.float32, config=config, groups=offsets)
    again = exl3_gemm(out, *views[0], 0, out_dtype=torch.float32, config=config, groups=offsets)
    assert torch.equal(got, again)
    for g, (t, su, sv) in enumerate(views):
        alone = exl3_gemm(out[:, g * k : (g + 1) * k], t, su, sv, 0, out_dtype=torch.float32, config=config)
        assert torch.equal(got[:, g * n : (g + 1) * n], alone), f"group {g}"
    # the decode steps' pinned launch with one live row: that row's bits, zeros after it
    one = exl3_gemm(out, *views[0], 0, out_dtype=torch.float32, config=config, groups=offsets, live=1)
    assert torch.equal(one[:1], got[:1]) and not one[1:].any()


@pytest.mark.parametrize(
    ("k", "n", "bits", "codebook"),
    [(4096, 1024, 4, 0), (1024, 32768, 4, 2), (8192, 4096, 4, 1), (4096, 512, 2, 0), (2048, 1024, 3, 1),
     (2048, 1024, 5, 2), (2048, 1024, 8, 0), (2048, 1024, 2.5, 2)],
)  # fmt: skip
def test_row_free_rows_have_the_bits_of_sixteen(k, n, bits, codebook):
    """GemmConfig(row_free=True): a launch of 1-16 live rows gives each its bits in the 16-row launch (the mma
    decode with the weights as A runs only the live rows: one mma a tile up to 8, two above), zeros after
    them; within the matrix units' tolerance of float64 (fp16 inputs, as the 16-row default)."""
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.gemv import GemmConfig, exl3_gemm

    tr, suh, svh, cb = _group(k, n, bits, codebook, 7)
    config = GemmConfig(row_free=True)
    x = torch.randn(16, k, device="cuda").to(torch.bfloat16)
    every = exl3_gemm(x, tr, suh, svh, cb, config=config, out_dtype=torch.float32)
    want = x.double() @ exl3_decode(tr, suh, svh, cb, dtype=torch.float32).double()
    assert float((every.double() - want).norm() / want.norm()) < 2e-3
    for live in (1, 2, 3, 4, 5, 8, 9, 12, 16):
        poisoned = x.clone()
        poisoned[live:] = float("nan")
        got = torch.full((16, n), float("nan"), dtype=torch.float32, device="cuda")
        exl3_gemm(poisoned, tr, suh, svh, cb, config=config, out=got, live=live)
        assert torch.equal(got[:live], every[:live]), f"live {live}: a row's bits moved"
        assert not got[live:].any(), f"live {live}: the later rows are not zeros"


@pytest.mark.parametrize(
    ("k", "n", "bits", "codebook"),
    [(4096, 1024, 4, 0), (1024, 32768, 4, 2), (2048, 1024, 3, 1), (2048, 1024, 2.5, 2)],
)
def test_row_free_wide_launches_keep_each_rows_bits(k, n, bits, codebook):
    """A row-free launch of up to 64 rows (launch_rows: 4 chunks of 16 a program on the mma decode, each decoded
    tile multiplied into all of them; 16 on a half-integer width) gives every row the bits it has in a launch of
    16 rows and of one row, live rows too, zeros after them."""
    from tfc.kernels.exl3.gemv import GemmConfig, exl3_gemm, launch_rows

    tr, suh, svh, cb = _group(k, n, bits, codebook, 9)
    config = GemmConfig(row_free=True)
    most = launch_rows(config, tr.shape)
    assert most == (16 if bits % 1 else 64)
    x = torch.randn(most, k, device="cuda").to(torch.bfloat16)
    every = exl3_gemm(x, tr, suh, svh, cb, config=config, out_dtype=torch.float32)
    for lo in range(0, most, 16):
        sixteen = exl3_gemm(x[lo : lo + 16], tr, suh, svh, cb, config=config, out_dtype=torch.float32)
        assert torch.equal(every[lo : lo + 16], sixteen), f"rows {lo}..: a row's bits moved"
    for r in (0, most - 1):
        assert torch.equal(every[r : r + 1], exl3_gemm(x[r : r + 1], tr, suh, svh, cb, config=config,
                                                        out_dtype=torch.float32)), f"row {r} alone"  # fmt: skip
    for live in (17, 33, 40):
        if live < most:
            got = exl3_gemm(x, tr, suh, svh, cb, config=config, out_dtype=torch.float32, live=live)
            assert torch.equal(got[:live], every[:live]) and not got[live:].any(), f"live {live}"


def test_row_free_grouped_wo_a_rows_have_the_bits_of_sixteen():
    """The eight wo_a groups in one row-free grouped launch: 1-16 live rows, each with its 16-row bits."""
    from tfc.kernels.exl3.gemv import GemmConfig, exl3_gemm, group_offsets

    k, n, ng = 4096, 1024, 8
    made = [_group(k, n, 4, 0, 200 + g) for g in range(ng)]
    views = pooled_groups(made)
    offsets = group_offsets(*([v[i] for v in views] for i in range(3)))
    config = GemmConfig(row_free=True)
    x = torch.randn(16, ng * k, device="cuda")
    every = exl3_gemm(x, *views[0], 0, out_dtype=torch.float32, config=config, groups=offsets)
    for g, (t, su, sv) in enumerate(views):
        alone = exl3_gemm(x[:, g * k : (g + 1) * k], t, su, sv, 0, out_dtype=torch.float32, config=config)
        assert torch.equal(every[:, g * n : (g + 1) * n], alone), f"group {g}"
    for live in (1, 4, 9):
        got = exl3_gemm(x, *views[0], 0, out_dtype=torch.float32, config=config, groups=offsets, live=live)
        assert torch.equal(got[:live], every[:live]) and not got[live:].any(), f"live {live}"
    # 64 rows in one grouped launch (4 chunks of 16 a program): each row's bits among 16
    wide = torch.randn(64, ng * k, device="cuda")
    got = exl3_gemm(wide, *views[0], 0, out_dtype=torch.float32, config=config, groups=offsets)
    for lo in range(0, 64, 16):
        sixteen = exl3_gemm(
            wide[lo : lo + 16], *views[0], 0, out_dtype=torch.float32, config=config, groups=offsets
        )
        assert torch.equal(got[lo : lo + 16], sixteen), f"rows {lo}.."


@pytest.mark.parametrize(
    ("layout", "mma"),
    [
        ("stack", 0),
        ("ragged", 0),
        ("stack", 1),
        ("stack", 2),
        ("stack", 4),
        ("ragged_int", 0),
        ("ragged_int", 2),
        ("ragged_int", 4),
    ],
)
def test_moe_matches_reference(layout, mma):
    """The MoE over a Flash layer's tables; mma: the weights-as-A mma decode (MoeConfig.mma), each pair's row
    as an fp16 high / low pair, so the fp32 paths' tolerance holds; ragged_int: routed 2-5 bit and a 6-bit
    shared expert, integer widths only (the mma decode takes a branch per width)."""
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.expert_table import ExpertTable
    from tfc.kernels.exl3.moe import MoeConfig, moe_exl3, moe_reference

    d, inter, routed, topk, tokens = 5120, 2304, 12, 6, 3
    rng = np.random.default_rng(7)
    tables, dense = [], []
    for proj, (k, n) in enumerate([(d, inter), (d, inter), (inter, d)]):
        rates = [2, 3, 4, 5] if layout == "ragged_int" else [2, 2.5, 3, 4]
        bits = [4] * (routed + 1) if layout == "stack" else [*rng.choice(rates, size=routed).tolist(), 6]
        groups = [_group(k, n, b, 2, 100 * proj + e) for e, b in enumerate(bits)]
        tables.append(ExpertTable.build(groups, layout=layout.removesuffix("_int")))
        dense.append([exl3_decode(*g, dtype=torch.float32) for g in groups])
    if layout == "ragged_int":  # several widths in every table, so the launches take their width branches
        assert all(len(t.width_set) > 2 for t in tables) and all(t.integer_widths for t in tables)
    x = torch.randn(tokens, d, device="cuda").to(torch.bfloat16)
    ids = torch.stack([torch.randperm(routed)[:topk] for _ in range(tokens)]).cuda()
    wts = torch.rand(tokens, topk, device="cuda") + 0.05
    want = moe_reference(x, ids, wts, *dense, swiglu_limit=10.0)
    outs = []
    for _ in range(2):
        out = torch.full((tokens, d), float("nan"), dtype=torch.float32, device="cuda")
        moe_exl3(x, ids, wts, *tables, swiglu_limit=10.0, config=MoeConfig(mma=mma), out=out)
        outs.append(out)
    assert float((outs[0].double() - want).norm() / want.norm()) < 1e-4
    assert torch.equal(outs[0], outs[1]), "the split-k and pair sums must be deterministic"


def test_moe_rows_keep_their_bits_among_many():
    """The MoE as the fast forward pins it (pinned_config: k-splits of one token's pairs) over ragged tables of
    integer widths (the mma decode): 64 tokens routed onto 12 experts, so each expert's run of pairs spans many
    groups of 4 decoded together, give each token the bits it gets alone, and agree with the reference."""
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.expert_table import ExpertTable
    from tfc.kernels.exl3.moe import moe_exl3, moe_reference, pinned_config

    d, inter, routed, topk, tokens = 5120, 2304, 12, 6, 64
    rng = np.random.default_rng(11)
    tables, dense = [], []
    for proj, (k, n) in enumerate([(d, inter), (d, inter), (inter, d)]):
        bits = [*rng.choice([2, 3, 4, 5], size=routed).tolist(), 6]
        groups = [_group(k, n, b, 2, 100 * proj + e) for e, b in enumerate(bits)]
        tables.append(ExpertTable.build(groups, layout="ragged"))
        dense.append([exl3_decode(*g, dtype=torch.float32) for g in groups])
    config = pinned_config(*tables, topk, torch.device("cuda"))
    assert config.mma
    x = torch.randn(tokens, d, device="cuda").to(torch.bfloat16)
    ids = torch.stack([torch.randperm(routed)[:topk] for _ in range(tokens)]).cuda()
    wts = torch.rand(tokens, topk, device="cuda") + 0.05
    together = moe_exl3(x, ids, wts, *tables, swiglu_limit=10.0, config=config, out_dtype=torch.float32)
    want = moe_reference(x, ids, wts, *dense, swiglu_limit=10.0)
    assert float((together.double() - want).norm() / want.norm()) < 1e-4
    for t in (0, 1, 17, 63):
        alone = moe_exl3(x[t : t + 1], ids[t : t + 1], wts[t : t + 1], *tables, swiglu_limit=10.0, config=config,
                         out_dtype=torch.float32)  # fmt: skip
        assert torch.equal(together[t : t + 1], alone), t


@pytest.mark.parametrize("rows", [1, 16, 48])
def test_sinkhorn_matches_the_models_loop(rows):
    # 2e-6 absolute on entries in [0, 1], as under the interpreter (tests/kernels/interpret/test_triton_sinkhorn.py),
    # with the GPU's exp in it
    from tfc.kernels.dsv41.mhc_sinkhorn import sinkhorn
    from tfc.runtime.models.dsv41.reference.mhc import sinkhorn as loop

    logits = (
        torch.randn(rows, 4, 4, device="cuda", generator=torch.Generator(device="cuda").manual_seed(rows)) * 3
    )
    got = sinkhorn(logits, 20, 1e-6)
    assert float((got.double() - loop(logits.double(), 20, 1e-6)).abs().max()) < 2e-6
