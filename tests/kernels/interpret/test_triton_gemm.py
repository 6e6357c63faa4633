"""The fused Triton EXL3 GEMV/GEMM against float64 references, under the CPU interpreter (see conftest.py);
the launch defaults the interpreter resolves (fast: no launch).

Inputs are random (never zero), outputs are poisoned with NaN before every launch, and every case leaves the arrival
counters at zero. Each case runs once: the interpreter runs a launch's programs one after another, always in the
same order, so a second run could not differ; run-to-run equality is checked on the GPU (test_kernels_gpu.py).
"""

from __future__ import annotations

import pytest
from support.exl3_inputs import pooled_groups, random_group, seeded

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
    ("m1_gather", 32, 2, 1, 256, "float16", {"runs": False, "split": 2}),
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
    ("m4_dot", 24, 2, 4, 256, "float16", {"split": 2}),
    ("m16_dot", 64, 1, 16, 256, "bfloat16", {"use_dot": True, "fuse_rotation": False, "split": 2}),
    # The k-split partials summed in a second launch, one program per (column block, row) (reduce_apart, the
    # mma decode's default from 2 rows), after the run decode and after the matrix units.
    ("m3_runs_apart", 48, 2, 3, 128, "float16", {"split": 4, "reduce_apart": True}),
    ("m16_dot_apart", 32, 0, 16, 256, "bfloat16", {"use_dot": True, "split": 2, "reduce_apart": True}),
    # ... GemmConfig.reduce_flight (8) partials loaded at a time: more than the split (masked), and fewer (two rounds)
    ("m1_runs_apart_masked", 64, 2, 1, 256, "float16", {"split": 4, "reduce_apart": True}),
    ("m2_runs_apart_rounds", 64, 0, 2, 256, "float16", {"split": 16, "block_k": 16, "reduce_apart": True}),
]
# Tolerances (relative Frobenius error against float64): the FMA paths (one row, and the run decode for any
# rows) are fp32 throughout: fp32 rotated input and fp32 accumulation, so only fp32 rounding remains (measured
# ~3e-7); the matrix-unit path rounds the rotated input to fp16 (2^-11), measured ~2e-4.
TOL_FMA, TOL_DOT = 1e-5, 1e-3


# Under the interpreter the run decode takes 4-30 s a case: those run in the full suite only (slow); the gather
# decode and the matrix units take about a second and stay in the fast lane.
FAST = {"m1_gather", "m1_gather_half_rate", "m4_dot", "m16_dot", "m16_dot_apart"}
PARAMS = [pytest.param(*c, id=c[0], marks=() if c[0] in FAST else pytest.mark.slow) for c in GEMM_CASES]


@pytest.mark.parametrize(("name", "width", "cb", "rows", "k", "dtype", "cfg"), PARAMS)
def test_gemm_kernel(tk, name, width, cb, rows, k, dtype, cfg):
    import torch

    g = tk.exl3_gemv
    assert g.GemmConfig().reduce_flight == 8  # the masked and two-round cases above are sized for 8
    rng = seeded(f"gemm_{name}")
    (tr, suh, svh, _), dense = random_group(tk.exl3_reference, rng, k, 256, width, cb)
    x = torch.randn(rows, k).to(getattr(torch, dtype))
    want = x.double() @ dense.double()
    config = g.GemmConfig(**cfg)
    got = torch.full((rows, 256), float("nan"), dtype=torch.float32)
    g.exl3_gemm(x, tr, suh, svh, cb, config=config, out=got)
    err = float((got.double() - want).norm() / want.norm())
    tol = TOL_DOT if g.uses_matrix_units(config, rows, tr.shape) else TOL_FMA
    assert err < tol, (err, tol)
    assert (g.counters(x.device, 1) == 0).all(), "arrival counters left non-zero"
    if name == "m3_runs_default_w48":  # the same run with the input rotated beforehand (x_rotated)
        y = torch.full((rows, 256), float("nan"), dtype=torch.float32)
        g.exl3_gemm(g.rotate_input(x, suh, False), tr, suh, svh, cb, out=y, x_rotated=True)
        assert torch.equal(y, got)


def test_gemm_defaults(tk):
    """The launch defaults the interpreter resolves (no inline PTX there: no mma decode)."""
    g = tk.exl3_gemv
    d = {
        f"{rows}_{width}": g.GemmConfig().resolved(rows, width)
        for rows in (1, 4, 16)
        for width in (32, 40, 64)
    }
    head = g.GemmConfig().resolved(1, 96, 129280)
    # Integer widths take the run decode (fp32 FMAs) for 1 to run_rows_max (4) rows, two tiles per element for
    # several rows; the matrix units above that (measured as fast at 8 rows, faster at 16, on the H200).
    assert [(d[f"{r}_64"].runs, d[f"{r}_64"].use_dot) for r in (1, 4, 16)] == [
        (True, False),
        (True, False),
        (False, True),
    ]
    assert [(d[f"{r}_64"].block_k, d[f"{r}_64"].run_tiles) for r in (1, 4)] == [(32, 4), (16, 2)]
    # One row from 4 bits: one-warp programs, 32 per SM (more warps in flight); at 2-3 bits two-warp ones,
    # 8 per SM (measured faster on the routed shapes).
    assert (d["1_64"].num_warps, d["1_64"].waves) == (1, 32.0)
    assert (d["1_32"].block_k, d["1_32"].num_warps, d["1_32"].waves) == (64, 2, 8.0)
    # The input rotation is fused for one row except on very wide matrices (the head rotates once apart).
    assert d["1_32"].fuse_rotation and not head.fuse_rotation
    assert (d["16_64"].num_warps, d["16_64"].waves) == (4, 4.0)
    assert d["1_64"].fuse_rotation and not d["4_64"].fuse_rotation
    # Half-integer widths: the gather decode for one row, the matrix units for more.
    assert not d["1_40"].runs and not d["1_40"].use_dot
    assert not d["4_40"].runs and d["4_40"].use_dot and d["16_40"].use_dot
    assert not any(c.mma for c in d.values())


@pytest.mark.parametrize("cfg", [{"runs": False}, {"use_dot": True}], ids=["gather", "dot"])
def test_only_the_one_row_run_decode_fuses_the_rotation(tk, cfg):
    """fuse_rotation asked of another decode is refused in one line (the others take the rotation apart)."""
    import torch

    g = tk.exl3_gemv
    (tr, suh, svh, _), _ = random_group(tk.exl3_reference, seeded("fuse_refused"), 128, 256, 32, 1)
    with pytest.raises(ValueError, match="only the one-row run decode fuses"):
        g.exl3_gemm(torch.randn(1, 128), tr, suh, svh, 1, config=g.GemmConfig(fuse_rotation=True, **cfg))


GROUPED_CASES = [
    # (name, width, codebook, rows, config kwargs); k = 128 (256 fused), n = 128, three groups
    ("m16_dot_last", 32, 1, 16, {"use_dot": True, "split": 2}),
    ("m16_dot_apart", 64, 0, 16, {"use_dot": True, "split": 2, "reduce_apart": True}),
    ("m1_gather", 32, 2, 1, {"runs": False, "split": 2}),
    ("m3_runs_apart", 48, 2, 3, {"split": 4, "reduce_apart": True}),
    ("m1_runs_fused", 32, 1, 1, {"fuse_rotation": True, "split": 2}),
]
GROUPED_FAST = {"m16_dot_last", "m16_dot_apart", "m1_gather"}


@pytest.mark.parametrize(
    ("name", "width", "cb", "rows", "cfg"),
    [
        pytest.param(*c, id=c[0], marks=() if c[0] in GROUPED_FAST else pytest.mark.slow)
        for c in GROUPED_CASES
    ],
)
def test_grouped_gemm_gives_each_groups_own_bits(tk, name, width, cb, rows, cfg):
    """One grouped launch over three groups at uneven places in one buffer equals three exl3_gemm calls bit for
    bit, x read as column slices of a wider tensor (the attention output the wo_a groups take)."""
    import torch

    g = tk.exl3_gemv
    rng = seeded(f"grouped_{name}")
    k, n, ng = (256 if cfg.get("fuse_rotation") else 128), 128, 3
    made = [random_group(tk.exl3_reference, rng, k, n, width, cb)[0] for _ in range(ng)]
    # the groups' trellis, suh, svh laid out in one buffer with gaps, in another order than the groups'
    t_words, s_halves = made[0][0].numel(), k + n
    pool = torch.zeros(ng * (t_words + s_halves) + 4096, dtype=torch.int16)
    trellises, suhs, svhs = [], [], []
    at = 96
    for i in (2, 0, 1):
        tr, suh, svh, _ = made[i]
        view = pool[at : at + t_words].view(tr.shape)
        view.copy_(tr)
        at += t_words + 34
        su = pool[at : at + k].view(torch.float16)
        su.copy_(suh)
        at += k + 6
        sv = pool[at : at + n].view(torch.float16)
        sv.copy_(svh)
        at += n + 2
        trellises.append((i, view, su, sv))
    trellises.sort(key=lambda item: item[0])
    trellises, suhs, svhs = ([item[j] for item in trellises] for j in (1, 2, 3))
    wide = torch.randn(rows, ng * k + 64, dtype=torch.float16)
    x = wide[:, 32 : 32 + ng * k]
    config = g.GemmConfig(**cfg)
    offsets = g.group_offsets(trellises, suhs, svhs)
    got = torch.full((rows, ng * n), float("nan"), dtype=torch.float32)
    g.exl3_gemm(x, trellises[0], suhs[0], svhs[0], cb, config=config, out=got, groups=offsets)
    for i in range(ng):
        alone = g.exl3_gemm(x[:, i * k : (i + 1) * k], trellises[i], suhs[i], svhs[i], cb, config=config,
                            out_dtype=torch.float32)  # fmt: skip
        assert torch.equal(got[:, i * n : (i + 1) * n], alone), f"group {i} differs from its own launch"
    assert (g.counters(x.device, 1) == 0).all(), "arrival counters left non-zero"


def test_group_offsets_refuse_groups_that_do_not_match(tk):
    """Groups of other shapes, or at offsets that are not whole elements, are refused with a ValueError."""
    import torch

    g = tk.exl3_gemv
    tr = torch.zeros(8, 16, 32, dtype=torch.int16)
    s = torch.zeros(128, dtype=torch.float16)
    with pytest.raises(ValueError, match="one shape"):
        g.group_offsets([tr, tr[:4]], [s, s], [s, s[:64]])
    pool = torch.zeros(tr.numel() + 2, dtype=torch.int16)
    odd = pool[1 : 1 + tr.numel()].view(tr.shape)
    with pytest.raises(ValueError, match="whole 4-byte"):
        g.group_offsets([tr, odd], [s, s], [s, s])


@pytest.mark.parametrize(
    ("name", "width", "cb", "rows", "cfg"),
    [
        pytest.param("m16_dot_last", 32, 1, 16, {"use_dot": True, "split": 2}, id="m16_dot_last"),
        pytest.param(
            "m16_dot_apart",
            64,
            0,
            16,
            {"use_dot": True, "split": 2, "reduce_apart": True},
            id="m16_dot_apart",
        ),
        pytest.param("m3_runs_by_row", 48, 2, 3, {"split": 4}, id="m3_runs_by_row", marks=pytest.mark.slow),
    ],
)
def test_gemm_live_rows_keep_their_bits_and_zero_the_rest(tk, name, width, cb, rows, cfg):
    """exl3_gemm(live=): the first `live` rows as every row's launch gives them, the rest zeros (whichever way
    the partials are summed: in the last program, apart, row by row)."""
    import torch

    g = tk.exl3_gemv
    (tr, suh, svh, _), _ = random_group(tk.exl3_reference, seeded(f"live_{name}"), 128, 256, width, cb)
    x = torch.randn(rows, 128)
    config = g.GemmConfig(**cfg)
    every = g.exl3_gemm(x, tr, suh, svh, cb, config=config, out_dtype=torch.float32)
    for live in (1, rows - 1):
        got = torch.full((rows, 256), float("nan"), dtype=torch.float32)
        g.exl3_gemm(x, tr, suh, svh, cb, config=config, out=got, live=live)
        assert torch.equal(got[:live], every[:live]), f"live {live}: a wanted row moved"
        assert not got[live:].any(), f"live {live}: the other rows are not zeros"
    with pytest.raises(ValueError, match="live"):
        g.exl3_gemm(x, tr, suh, svh, cb, config=config, live=rows + 1)


@pytest.mark.parametrize(
    ("width", "cb", "grouped"), [(32, 1, False), (40, 2, True)], ids=["w32", "w40_grouped"]
)
def test_row_free_live_rows_run_alone_with_the_bits_of_sixteen(tk, width, cb, grouped):
    """GemmConfig(row_free=True) with live rows: the product runs those rows alone (the later rows of x are
    never read: NaN there changes nothing), each with the bits it has in a 16-row launch, zeros after them; its
    resolution does not depend on the rows (the interpreter's matrix units on 16 padded rows)."""
    import torch

    g = tk.exl3_gemv
    ng = 3 if grouped else 1
    made = [
        random_group(tk.exl3_reference, seeded(f"row_free_{width}_{i}"), 128, 256, width, cb)[0]
        for i in range(ng)
    ]
    tr, suh, svh, _ = made[0]
    groups = None
    if grouped:
        views = pooled_groups(made)
        tr, suh, svh = views[0]
        groups = g.group_offsets(*([v[i] for v in views] for i in range(3)))
    config = g.GemmConfig(row_free=True, split=2)
    resolved = {(c.use_dot, c.runs, c.block_k, c.num_warps, c.waves, c.reduce_apart) for c in
                (config.resolved(rows, width, 256, 128) for rows in (1, 3, 8, 16))}  # fmt: skip
    assert resolved == {(True, False, 32, 4, 4.0, True)}
    assert g.GemmConfig(row_free=True, reduce_apart=False).resolved(1, width, 256, 128).reduce_apart
    x = torch.randn(16, ng * 128)
    every = g.exl3_gemm(x, tr, suh, svh, cb, config=config, out_dtype=torch.float32, groups=groups)
    for live in (1, 5):
        poisoned = x.clone()
        poisoned[live:] = float("nan")
        got = torch.full((16, ng * 256), float("nan"), dtype=torch.float32)
        g.exl3_gemm(poisoned, tr, suh, svh, cb, config=config, out=got, live=live, groups=groups)
        assert torch.equal(got[:live], every[:live]), f"live {live}: a row's bits depend on the launch's rows"
        assert not got[live:].any(), f"live {live}: the later rows are not zeros"
    assert (g.counters(x.device, 1) == 0).all()


def test_row_free_k_split_is_capped(tk):
    """GemmConfig.row_free_max_split caps a row_free launch's k-split (fewer partials to sum): the capped launch
    is the launch of that split, and a launch that sets its split keeps it."""
    import torch

    g = tk.exl3_gemv
    (tr, suh, svh, _), _ = random_group(tk.exl3_reference, seeded("row_free_cap"), 512, 256, 32, 1)
    x = torch.randn(16, 512)

    def run(**cfg):
        config = g.GemmConfig(row_free=True, **cfg)
        return g.exl3_gemm(x, tr, suh, svh, 1, config=config, out_dtype=torch.float32, live=2)

    one = run(split=1)
    assert not torch.equal(run(row_free_max_split=0), one), "the uncapped split should differ from 1 here"
    assert torch.equal(run(row_free_max_split=1), one)
    assert torch.equal(run(split=4, row_free_max_split=1), run(split=4, row_free_max_split=0))
