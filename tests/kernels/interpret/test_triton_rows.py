"""The many-row EXL3 kernel (prefill) against float64 references under the CPU interpreter (see conftest.py):
a linear at row counts across tile edges, a row's bits alone and among others, the MoE over stacked and
ragged tables, each through the decoded scratch and through the tile path; the scratch's decode against the
reference's W-hat and its rounds; the device-built tile list, and the rotation kernel against the torch
rotation, bit for bit.

With both halves (`LOW_HALF`) the input goes in as fp16 high / low halves of the fp32 rotation and the output
Hadamard runs as fp32 butterflies: both keep fp32-level error (measured ~1e-7 relative here), so 1e-5 would
catch a dropped half (~1e-4) or a wrong column block (order 1). By default the products take the high halves
alone (the rows rounded to fp16): the linear is held to 1e-5 against float64 on the rows the halves stand for,
the MoE (whose gate, up and down inputs are each rounded) to TOL_ONE_HALF against float64 on its exact input.
"""

from __future__ import annotations

import pytest
from support.exl3_inputs import random_group, seeded

TOL = 1e-5
# fp16 rounding of each table's input: 2^-12 relative RMS a value (~2.4e-4), a few such roundings deep
TOL_ONE_HALF = 2e-3
HALVES = pytest.mark.parametrize("low_half", [True, False], ids=["two_halves", "one_half"])


PATHS = pytest.mark.parametrize("scratch", ["all", "none"], ids=["scratch", "tiles"])


@PATHS
@HALVES
@pytest.mark.parametrize(("width", "codebook", "rows"), [(32, 2, 70), (48, 0, 64), (64, 1, 3)])
def test_rows_gemm_matches_float64_and_each_row_is_alone(
    tk, monkeypatch, scratch, low_half, width, codebook, rows
):
    import torch

    monkeypatch.setattr(tk.exl3_rows, "SCRATCH", scratch)
    monkeypatch.setattr(tk.exl3_rows, "LOW_HALF", low_half)

    rng = seeded(f"rows_{width}_{codebook}_{rows}")
    (trellis, suh, svh, cb), dense = random_group(tk.exl3_reference, rng, 128, 256, width, codebook)
    x = torch.randn(rows, 128)
    y = torch.full((rows, 256), float("nan"))
    tk.exl3_rows.exl3_gemm_rows(x, trellis, suh, svh, cb, out=y)
    want = tk.exl3_rotate.rows_seen(x, suh, tk.exl3_rows.LOW_HALF).double() @ dense.double()
    err = float((y.double() - want).norm() / want.norm())
    assert err < TOL, err
    # The same rows at the same places of their tile, alone: equal bits (the interpreter's products may round a
    # row by its place in the tile; the GPU's matrix units do not: test_kernels_gpu.py moves rows too).
    lo = (rows - 1) // 64 * 64
    alone = tk.exl3_rows.exl3_gemm_rows(x[lo:], trellis, suh, svh, cb)
    assert torch.equal(alone, y[lo:]), "a row's bits must not depend on the rows beside it"


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
@pytest.mark.parametrize(  # the one-half products on the ragged tables only (the stacked ones add no case)
    ("layout", "low_half"),
    [("stack", True), ("ragged", True), ("ragged", False)],
    ids=["stack", "ragged", "ragged_one_half"],
)
def test_moe_rows_matches_the_float64_reference(tk, monkeypatch, scratch, layout, low_half):
    import torch

    monkeypatch.setattr(tk.exl3_rows, "SCRATCH", scratch)
    monkeypatch.setattr(tk.exl3_rows, "LOW_HALF", low_half)

    rng = seeded(f"moe_rows_{layout}")
    tables, dense = _tables(tk, rng, layout)
    x = torch.randn(TOKENS, D)
    ids = torch.stack([torch.randperm(ROUTED)[:TOPK] for _ in range(TOKENS)])
    wts = torch.rand(TOKENS, TOPK) + 0.1
    want = tk.moe_exl3.moe_reference(x, ids, wts, *dense, swiglu_limit=LIMIT)
    unclamped = tk.moe_exl3.moe_reference(x, ids, wts, *dense, swiglu_limit=0.0)
    assert (unclamped - want).norm() / want.norm() > 1e-2, "the inputs must exercise the SwiGLU clamp"
    y = tk.exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=LIMIT)
    err = float((y.double() - want).norm() / want.norm())
    print(f"moe rows {'two halves' if low_half else 'one half'}: {err:.2e}")
    assert err < (TOL if low_half else TOL_ONE_HALF), err
    # Tokens with other tokens' values changed: equal bits (each expert's rows keep their places in its tiles).
    other = x.clone()
    other[1::2] *= 2.0
    again = tk.exl3_rows.moe_rows(other, ids, wts, *tables, swiglu_limit=LIMIT)
    assert torch.equal(again[::2], y[::2]), "a token's bits must not depend on the other tokens' values"


@pytest.mark.parametrize("layout", ["stack", "ragged"])
def test_the_scratch_holds_each_entrys_w_hat_and_its_rounds_keep_the_bits(tk, monkeypatch, layout):
    import torch

    rng = seeded(f"scratch_{layout}")
    groups: list = []
    tables, _ = _tables(tk, rng, layout, groups)
    w1 = tables[0]
    # The decode alone: every entry with rows gets the reference's W-hat exactly, the others are not written.
    hit = torch.tensor([1, 0, 3, 0, 2], dtype=torch.int32)
    for cut in (0, 1):  # exl3_lanes.CUTS: from 64-bit pairs, at constexpr bits
        scratch = torch.full((w1.entries, D, INTER), float("nan"), dtype=torch.float16)
        tk.exl3_scratch._decode_entries_kernel[((D // 128) * (INTER // 128), w1.entries)](
            w1.words, w1.offsets, w1.widths, w1.codebooks, hit, scratch, 0, w1.entries, INTER, D,
            WIDTHS=tuple(w1.width_set), CB=w1.codebook, TK=tk.exl3_scratch.TILE_ROWS,
            KB=tk.exl3_scratch.DECODE_ROWS, CUT=cut,
        )  # fmt: skip
        for e in range(w1.entries):
            if hit[e]:
                trellis, _, _, codebook = groups[0][e]
                want = tk.exl3_reference.decode_rotated(trellis.numpy(), int(codebook))
                assert torch.equal(scratch[e].float(), torch.from_numpy(want).float()), (cut, e)
            else:
                assert bool(scratch[e].isnan().all()), (cut, e)
    # The MoE with the scratch one entry a round (five rounds) against every entry in one: equal bits.
    x = torch.randn(TOKENS, D)
    ids = torch.stack([torch.randperm(ROUTED)[:TOPK] for _ in range(TOKENS)])
    wts = torch.rand(TOKENS, TOPK) + 0.1
    one = tk.exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=LIMIT)
    monkeypatch.setattr(tk.exl3_scratch, "SCRATCH_BYTES", 1)
    assert torch.equal(tk.exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=LIMIT), one)


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


def test_the_default_sends_the_linears_through_the_scratch_and_the_moe_to_the_tiles_below_wide_steps(
    tk, monkeypatch
):
    import torch

    assert tk.exl3_rows.SCRATCH == "dense"
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
def test_the_tiles_lane_decode_gives_the_window_decodes_bits(tk, monkeypatch, width, codebook, block_k):
    import torch

    monkeypatch.setattr(tk.exl3_rows, "SCRATCH", "none")
    monkeypatch.setattr(tk.exl3_rows, "BLOCK_K", block_k)  # the default k step, and prefill_h200's k64
    assert tk.exl3_rows.TILE_DECODE == "lanes"
    rng = seeded(f"lanes_{width}_{codebook}")
    (trellis, suh, svh, cb), dense = random_group(tk.exl3_reference, rng, 128, 256, width, codebook)
    x = torch.randn(70, 128)
    lanes = tk.exl3_rows.exl3_gemm_rows(x, trellis, suh, svh, cb)
    monkeypatch.setattr(tk.exl3_rows, "TILE_DECODE", "windows")
    windows = tk.exl3_rows.exl3_gemm_rows(x, trellis, suh, svh, cb)
    assert torch.equal(lanes, windows), "the two decodes must give one W-hat, so one set of bits"
    want = tk.exl3_rotate.rows_seen(x, suh, tk.exl3_rows.LOW_HALF).double() @ dense.double()
    assert float((lanes.double() - want).norm() / want.norm()) < TOL


def _ragged_moe(tk, seed: str):
    """A ragged table's MoE inputs: (tables, x, ids, weights)."""
    import torch

    tables, _ = _tables(tk, seeded(seed), "ragged")
    ids = torch.stack([torch.randperm(ROUTED)[:TOPK] for _ in range(TOKENS)])
    return tables, torch.randn(TOKENS, D), ids, torch.rand(TOKENS, TOPK) + 0.1


@pytest.mark.parametrize("block_k", [32, 64])
@pytest.mark.parametrize(("width", "codebook"), [(16, 0), (48, 1), (112, 0), (128, 2)])
def test_the_tiles_prefetching_loop_gives_the_plain_loops_bits(tk, monkeypatch, width, codebook, block_k):
    import torch

    monkeypatch.setattr(tk.exl3_rows, "SCRATCH", "none")
    monkeypatch.setattr(tk.exl3_rows, "BLOCK_K", block_k)
    rng = seeded(f"prefetch_{width}_{codebook}")
    (trellis, suh, svh, cb), _ = random_group(tk.exl3_reference, rng, 128, 256, width, codebook)
    x = torch.randn(70, 128)
    assert tk.exl3_rows.TILE_PREFETCH, "on by default"
    monkeypatch.setattr(tk.exl3_rows, "TILE_PREFETCH", False)
    plain = tk.exl3_rows.exl3_gemm_rows(x, trellis, suh, svh, cb)
    monkeypatch.setattr(tk.exl3_rows, "TILE_PREFETCH", True)
    assert torch.equal(tk.exl3_rows.exl3_gemm_rows(x, trellis, suh, svh, cb), plain)


@pytest.mark.parametrize(
    ("option", "scratch"),  # the prefetch is the tiles' alone; the finish is both paths'
    [("TILE_PREFETCH", "none"), ("FINISH_IN_TILES", "none"), ("FINISH_IN_TILES", "all")],
)
def test_the_prefetching_loop_and_the_tiles_own_finish_keep_the_bits(tk, monkeypatch, option, scratch):
    """Each (on by default) against the loop without it, on a linear and a ragged table's MoE."""
    import torch

    monkeypatch.setattr(tk.exl3_rows, "SCRATCH", scratch)
    (trellis, suh, svh, cb), _ = random_group(
        tk.exl3_reference, seeded(f"{option}_{scratch}"), 128, 256, 48, 1
    )
    x = torch.randn(70, 128)
    tables, xm, ids, wts = _ragged_moe(tk, f"{option}_{scratch}_moe")

    def both():
        return (tk.exl3_rows.exl3_gemm_rows(x, trellis, suh, svh, cb),
                tk.exl3_rows.moe_rows(xm, ids, wts, *tables, swiglu_limit=LIMIT))  # fmt: skip

    assert getattr(tk.exl3_rows, option), "on by default"
    monkeypatch.setattr(tk.exl3_rows, option, False)
    without = both()
    monkeypatch.setattr(tk.exl3_rows, option, True)
    assert all(torch.equal(a, b) for a, b in zip(both(), without, strict=True))


def test_the_moes_tiles_lane_decode_gives_the_window_decodes_bits_over_a_ragged_table(tk, monkeypatch):
    import torch

    monkeypatch.setattr(tk.exl3_rows, "SCRATCH", "none")
    tables, x, ids, wts = _ragged_moe(tk, "lanes_ragged")
    lanes = tk.exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=LIMIT)
    monkeypatch.setattr(tk.exl3_rows, "TILE_DECODE", "windows")
    assert torch.equal(tk.exl3_rows.moe_rows(x, ids, wts, *tables, swiglu_limit=LIMIT), lanes)


def test_expert_tiles_cover_each_entrys_rows_once():
    import torch
    from tfc.kernels.exl3.rows import BLOCK_M, expert_tiles

    entries = torch.sort(torch.tensor([0] * 3 + [2] * (2 * BLOCK_M + 5) + [5] * BLOCK_M)).values
    tiles = expert_tiles(entries, 6).tolist()
    live = [t for t in tiles if t[2] > 0]
    assert live == [[0, 0, 3], [2, 3, BLOCK_M], [2, 3 + BLOCK_M, BLOCK_M], [2, 3 + 2 * BLOCK_M, 5],
                    [5, 8 + 2 * BLOCK_M, BLOCK_M]]  # fmt: skip
    assert len(tiles) == -(-entries.numel() // BLOCK_M) + 6


@pytest.mark.parametrize("per_row", [False, True])
def test_the_rotation_kernel_gives_the_torch_paths_bits(tk, per_row):
    import torch

    gen = torch.Generator().manual_seed(5)
    m, k = 9, 384
    x = torch.randn(m, k, generator=gen) * torch.logspace(-6, 3, m)[:, None]  # tiny to large rows
    x[3] = 0.0  # an all-zero row: the clamp's power of two
    x[4, 7] = 2.0**14  # a row with one value far above the rest
    signs = torch.randint(0, 2, (m, k) if per_row else (k,), generator=gen).half() * 2 - 1
    want_halves, want_inv = tk.exl3_rows.split_halves(tk.exl3_rows.fwht128_rows(x * signs.float()))
    halves, inv = tk.exl3_rows.rotate_rows(x, signs)
    assert torch.equal(halves, want_halves) and torch.equal(inv, want_inv)
    # every row's high part tops out in [2^14, 2^15): no fp16 overflow, the low part clear of subnormals
    top = halves[:, 0].float().abs().amax(dim=1)
    live = tk.exl3_rows.fwht128_rows(x * signs.float()).abs().amax(dim=1) > 0
    assert int(live.sum()) == m - 1, "only the zero row rotates to zeros"
    assert bool(((top[live] >= 2.0**14) & (top[live] <= 2.0**15)).all()), top
    # the scaling keeps the pair's sum at the rotation's value to fp32 rounding
    back = (halves[:, 0].float() + halves[:, 1].float()) * inv[:, None]
    rotated = tk.exl3_rows.fwht128_rows(x * signs.float())
    assert float((back - rotated).abs().max()) <= 2.0**-20 * float(rotated.abs().max())


def test_the_rotation_kernel_reads_gathered_rows_and_signs_in_place(tk):
    import torch

    gen = torch.Generator().manual_seed(6)
    x = torch.randn(5, 256, generator=gen).bfloat16()  # the MoE's tokens, as the forward holds them
    signs = torch.randint(0, 2, (3, 256), generator=gen).half() * 2 - 1  # an expert table's suh rows
    rows = torch.tensor([4, 0, 0, 2, 4, 1, 3])
    entries = torch.tensor([0, 0, 1, 1, 2, 2, 2])
    want = tk.exl3_rows.split_halves(tk.exl3_rows.fwht128_rows(x[rows].float() * signs[entries].float()))
    for got in (
        tk.exl3_rows.rotate_rows(x, signs, rows, entries),
        tk.exl3_rows.rotated_pairs(x, signs, rows, entries),
    ):
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # without the low halves (the default products read the high ones alone): the high halves and scales alone
    halves, inv = tk.exl3_rows.rotate_rows(x, signs, rows, entries, low=False)
    assert torch.equal(halves[:, 0], want[0][:, 0]) and torch.equal(inv, want[1])
    per_pair = x[rows].float()  # entries alone: the rows are already one a pair (the MoE's down products)
    got = tk.exl3_rows.rotate_rows(per_pair, signs, entries=entries)
    want = tk.exl3_rows.split_halves(tk.exl3_rows.fwht128_rows(per_pair * signs[entries].float()))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
