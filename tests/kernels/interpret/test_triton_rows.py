"""The many-row EXL3 kernel (prefill) against float64 references under the CPU interpreter (see conftest.py):
a linear at row counts across tile edges, a row's bits alone and among others, the MoE over stacked and
ragged tables, each through the decoded scratch and through the tile path; the scratch's decode against the
reference's W-hat and its rounds; the device-built tile list, and the rotation kernel against the torch
rotation, bit for bit.

The products take the rows rounded to fp16 (after a per-row power of two) and run the output Hadamard as fp32
butterflies: the linear is held to 1e-5 against float64 on the rows the fp16 values stand for (a wrong column
block is order 1), the MoE (whose gate, up and down inputs are each rounded) to TOL_MOE against float64 on its
exact input.
"""

from __future__ import annotations

import pytest
from support.exl3_inputs import random_group, seeded

TOL = 1e-5
# fp16 rounding of each table's input: 2^-12 relative RMS a value (~2.4e-4), a few such roundings deep
TOL_MOE = 2e-3
PATHS = pytest.mark.parametrize("scratch", [True, False], ids=["scratch", "tiles"])


def _linear_rows(tk, x, trellis, suh, svh, cb, scratch: bool, out=None, block_k: int = 64):
    """exl3_gemm_rows' product through the scratch or (scratch False) the tiles, with this k step."""
    import torch

    _, tn, width = trellis.shape
    n = 16 * tn
    one = torch.zeros(1, dtype=torch.int64)
    y = out if out is not None else torch.empty((x.shape[0], n))
    config = tk.exl3_rows.RowsConfig(block_k=block_k)
    return tk.exl3_rows.launch_rows(
        tk.exl3_rotate.rotated_rows(x, suh), trellis.contiguous().view(torch.int32).reshape(-1), one,
        torch.full((1,), width, dtype=torch.int32), one.int() + cb, svh,
        tk.exl3_rows.dense_tiles(x.shape[0], x.device), n, (width,), cb, y, scratch=scratch, config=config,
    )  # fmt: skip


@PATHS
@pytest.mark.parametrize(("width", "codebook", "rows"), [(32, 2, 70), (48, 0, 64), (64, 1, 3)])
def test_rows_gemm_matches_float64_and_each_row_is_alone(tk, scratch, width, codebook, rows):
    import torch

    rng = seeded(f"rows_{width}_{codebook}_{rows}")
    (trellis, suh, svh, cb), dense = random_group(tk.exl3_reference, rng, 128, 256, width, codebook)
    x = torch.randn(rows, 128)
    y = torch.full((rows, 256), float("nan"))
    _linear_rows(tk, x, trellis, suh, svh, cb, scratch, out=y)
    want = tk.exl3_rotate.rows_seen(x, suh).double() @ dense.double()
    err = float((y.double() - want).norm() / want.norm())
    assert err < TOL, err
    # The same rows at the same places of their tile, alone: equal bits (the interpreter's products may round a
    # row by its place in the tile; the GPU's matrix units do not: test_kernels_gpu.py moves rows too).
    lo = (rows - 1) // 64 * 64
    alone = _linear_rows(tk, x[lo:], trellis, suh, svh, cb, scratch)
    assert torch.equal(alone, y[lo:]), "a row's bits must not depend on the rows beside it"
    if scratch:
        assert torch.equal(tk.exl3_rows.exl3_gemm_rows(x, trellis, suh, svh, cb), y), "the linears' path"


D, INTER, ROUTED, TOPK, TOKENS, LIMIT = 128, 256, 4, 2, 37, 0.3


def _tables(tk, rng, layout: str, groups_out: list | None = None):
    tables, dense = [], []
    for proj, (k, n) in enumerate([(D, INTER), (D, INTER), (INTER, D)]):
        if layout == "stack":
            specs = [(32, 2)] * (ROUTED + 1)
        else:  # mixed integer widths, and for w3 mixed codebooks (chosen per entry at run time)
            specs = [(w, e % 3 if proj == 1 else 2) for e, w in enumerate((32, 48, 64, 32, 96))]
        groups = [random_group(tk.exl3_reference, rng, k, n, w, c) for w, c in specs]
        if groups_out is not None:
            groups_out.append([g[0] for g in groups])
        tables.append(tk.expert_table.ExpertTable.build([g[0] for g in groups], layout=layout))
        dense.append([g[1] for g in groups])
    return tables, dense


@PATHS
@pytest.mark.parametrize("layout", ["stack", "ragged"])
def test_moe_rows_matches_the_float64_reference(tk, scratch, layout):
    import torch

    rng = seeded(f"moe_rows_{layout}")
    tables, dense = _tables(tk, rng, layout)
    x = torch.randn(TOKENS, D)
    ids = torch.stack([torch.randperm(ROUTED)[:TOPK] for _ in range(TOKENS)])
    wts = torch.rand(TOKENS, TOPK) + 0.1
    want = tk.moe_exl3.moe_reference(x, ids, wts, *dense, swiglu_limit=LIMIT)
    unclamped = tk.moe_exl3.moe_reference(x, ids, wts, *dense, swiglu_limit=0.0)
    assert (unclamped - want).norm() / want.norm() > 1e-2, "the inputs must exercise the SwiGLU clamp"
    y = tk.exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=LIMIT, scratch=scratch)
    err = float((y.double() - want).norm() / want.norm())
    assert err < TOL_MOE, err
    # Tokens with other tokens' values changed: equal bits (each expert's rows keep their places in its tiles).
    other = x.clone()
    other[1::2] *= 2.0
    again = tk.exl3_rows.moe_rows(other, ids, wts, *tables, swiglu_limit=LIMIT, scratch=scratch)
    assert torch.equal(again[::2], y[::2]), "a token's bits must not depend on the other tokens' values"


@pytest.mark.parametrize("layout", ["stack", "ragged"])
def test_the_scratch_holds_each_entrys_w_hat_and_its_rounds_keep_the_bits(tk, layout):
    import torch

    rng = seeded(f"scratch_{layout}")
    groups: list = []
    tables, _ = _tables(tk, rng, layout, groups)
    w1 = tables[0]
    # The decode alone: every entry with rows gets the reference's W-hat exactly, the others are not written.
    hit = torch.tensor([1, 0, 3, 0, 2], dtype=torch.int32)
    scratch = torch.full((w1.entries, D, INTER), float("nan"), dtype=torch.float16)
    tk.exl3_scratch.decode_round(w1.words, w1.offsets, w1.widths, w1.codebooks, hit, scratch, 0, w1.width_set,
                                 w1.codebook)  # fmt: skip
    for e in range(w1.entries):
        if hit[e]:
            trellis, _, _, codebook = groups[0][e]
            want = tk.exl3_reference.decode_rotated(trellis.numpy(), int(codebook))
            assert torch.equal(scratch[e].float(), torch.from_numpy(want).float()), e
        else:
            assert bool(scratch[e].isnan().all()), e
    # The MoE with the scratch one entry a round (five rounds) against every entry in one: equal bits.
    x = torch.randn(TOKENS, D)
    ids = torch.stack([torch.randperm(ROUTED)[:TOPK] for _ in range(TOKENS)])
    wts = torch.rand(TOKENS, TOPK) + 0.1
    one = tk.exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=LIMIT, scratch=True)
    rounds = tk.exl3_rows.RowsConfig(scratch=tk.exl3_scratch.ScratchConfig(scratch_bytes=1))
    assert torch.equal(tk.exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=LIMIT, scratch=True,
                                             config=rounds), one)  # fmt: skip


@pytest.mark.parametrize("width", [16, 24, 40, 56, 80, 112, 128])
def test_the_scratch_decode_gives_w_hat_at_every_width(tk, width):
    import torch

    rng = seeded(f"scratch_width_{width}")
    (trellis, _, _, cb), _ = random_group(
        tk.exl3_reference, rng, 128, 256, width, 2 if width % 16 else width % 3
    )
    scratch = torch.empty((1, 128, 256), dtype=torch.float16)
    one = torch.zeros(1, dtype=torch.int64)
    tk.exl3_scratch.decode_round(trellis.reshape(-1).view(torch.int32), one, torch.full((1,), width, dtype=torch.int32),
                                 one.int() + cb, torch.ones(1, dtype=torch.int32), scratch, 0, (width,), cb)  # fmt: skip
    want = tk.exl3_reference.decode_rotated(trellis.numpy(), cb)
    assert torch.equal(scratch[0].float(), torch.from_numpy(want).float())


def test_the_linears_take_the_scratch_and_the_moe_the_tiles_below_wide_steps(tk, monkeypatch):
    import torch

    calls = []
    real = tk.exl3_rows.scratch_rows
    monkeypatch.setattr(
        tk.exl3_rows, "scratch_rows", lambda *a, **k: calls.append(a[3].numel()) or real(*a, **k)
    )
    rng = seeded("default_paths")
    (trellis, suh, svh, cb), _ = random_group(tk.exl3_reference, rng, 128, 256, 32, 2)
    tk.exl3_rows.exl3_gemm_rows(torch.randn(5, 128), trellis, suh, svh, cb)
    assert calls == [1], "a linear goes through the scratch"
    tables, _ = _tables(tk, rng, "stack")
    ids = torch.stack([torch.randperm(ROUTED)[:TOPK] for _ in range(TOKENS)])
    tk.exl3_rows.moe_rows(torch.randn(TOKENS, D), ids, torch.rand(TOKENS, TOPK), *tables, swiglu_limit=LIMIT)
    assert calls == [1], "the MoE's tables stay on the tiles"
    assert tk.exl3_rows.moe_scratch(8192) and not tk.exl3_rows.moe_scratch(8191), (
        "wide steps take the scratch"
    )
    tk.exl3_rows.moe_rows(torch.randn(TOKENS, D), ids, torch.rand(TOKENS, TOPK), *tables, swiglu_limit=LIMIT,
                          scratch=True)  # fmt: skip
    assert calls == [1, 5, 5, 5], "the MoE's tables take the scratch when asked"


@pytest.mark.parametrize("block_k", [32, 64])
@pytest.mark.parametrize(
    ("width", "codebook"), [(16, 0), (24, 2), (48, 1), (56, 2), (80, 2), (112, 0), (128, 2)]
)  # 56: a half rate whose windows span three words
def test_the_tiles_lane_decode_matches_float64_and_the_scratch(tk, width, codebook, block_k):
    """The tiles' lane decode (each step loaded a step ahead) against float64 at every width class; at the
    scratch's k step (64) its bits are the scratch's, whose decode is held to the reference's W-hat above."""
    import torch

    rng = seeded(f"lanes_{width}_{codebook}")
    (trellis, suh, svh, cb), dense = random_group(tk.exl3_reference, rng, 128, 256, width, codebook)
    x = torch.randn(70, 128)
    lanes = _linear_rows(tk, x, trellis, suh, svh, cb, False, block_k=block_k)
    want = tk.exl3_rotate.rows_seen(x, suh).double() @ dense.double()
    assert float((lanes.double() - want).norm() / want.norm()) < TOL
    if block_k == 64:
        assert torch.equal(lanes, _linear_rows(tk, x, trellis, suh, svh, cb, True)), "one W-hat, one order"


def test_expert_tiles_cover_each_entrys_rows_once():
    import torch
    from tfc.kernels.exl3.rows import RowsConfig, expert_tiles

    bm = RowsConfig().block_m
    entries = torch.sort(torch.tensor([0] * 3 + [2] * (2 * bm + 5) + [5] * bm)).values
    tiles = expert_tiles(entries, 6).tolist()
    live = [t for t in tiles if t[2] > 0]
    assert live == [[0, 0, 3], [2, 3, bm], [2, 3 + bm, bm], [2, 3 + 2 * bm, 5], [5, 8 + 2 * bm, bm]]
    assert len(tiles) == -(-entries.numel() // bm) + 6
    assert expert_tiles(entries, 6, 32).tolist()[:2] == [[0, 0, 3], [2, 3, 32]], "the config's tile rows"


@pytest.mark.parametrize("per_row", [False, True])
def test_the_rotation_kernel_gives_the_torch_paths_bits(tk, per_row):
    import torch

    gen = torch.Generator().manual_seed(5)
    m, k = 9, 384
    x = torch.randn(m, k, generator=gen) * torch.logspace(-6, 3, m)[:, None]  # tiny to large rows
    x[3] = 0.0  # an all-zero row: the clamp's power of two
    x[4, 7] = 2.0**14  # a row with one value far above the rest
    signs = torch.randint(0, 2, (m, k) if per_row else (k,), generator=gen).half() * 2 - 1
    rotated = tk.exl3_rotate.fwht128_rows(x * signs.float())
    want_rows, want_inv = tk.exl3_rotate.scaled_fp16(rotated)
    xh, inv = tk.exl3_rotate.rotate_rows(x, signs)
    assert torch.equal(xh, want_rows) and torch.equal(inv, want_inv)
    # every row tops out in [2^14, 2^15): no fp16 overflow, its small values clear of fp16's subnormals
    top = xh.float().abs().amax(dim=1)
    live = rotated.abs().amax(dim=1) > 0
    assert int(live.sum()) == m - 1, "only the zero row rotates to zeros"
    assert bool(((top[live] >= 2.0**14) & (top[live] <= 2.0**15)).all()), top
    # the scaled row, scaled back, is the rotation rounded to fp16's 11 significant bits
    back = xh.float() * inv[:, None]
    assert bool(((back - rotated).abs() <= 2.0**-11 * rotated.abs().amax(dim=1, keepdim=True)).all())


def test_the_rotation_kernel_reads_gathered_rows_and_signs_in_place(tk):
    import torch

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(5, 256, generator=gen).bfloat16()  # the MoE's tokens, as the forward holds them
    signs = torch.randint(0, 2, (3, 256), generator=gen).half() * 2 - 1  # an expert table's suh rows
    rows = torch.tensor([4, 0, 0, 2, 4, 1, 3])
    entries = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    rot = tk.exl3_rotate
    want = rot.scaled_fp16(rot.fwht128_rows(x[rows].float() * signs[entries].float()))
    for got in (rot.rotate_rows(x, signs, rows, entries), rot.rotated_rows(x, signs, rows, entries)):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    per_pair = x[rows].float()  # entries alone: the rows are already one a pair (the MoE's down products)
    got = rot.rotate_rows(per_pair, signs, entries=entries)
    want = rot.scaled_fp16(rot.fwht128_rows(per_pair * signs[entries].float()))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
