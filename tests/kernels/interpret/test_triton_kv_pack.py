"""The packing and scoring stage kernels (kernels/dsv41/kv_pack.py) against the torch stages, interpreted.

Bit for bit where the kernel runs torch's very operations: the packers given the same rotated values (the rope
is one rounded product per term and one rounded sum, as in torch), so entry_rows and index_query whole, and
chunk_scores (exact 32-channel partial dots of FP4 values, blocks and heads summed in fixed_sum's tree).
window_rows and key_rows add rms_norm, whose sum of squares runs in another order than torch's: a normalised
value may differ by an ulp and a code then flip to its neighbour (bounded below). pooled is held within a
tolerance (exp and the sum of squares). Every stage must give a row the same bits alone as among other rows.
The references are the stages' torch bodies (`__wrapped__`): the `@fused` wrappers may dispatch to these
very kernels.
"""

from __future__ import annotations

import pytest
from support.stage_checks import code_steps

N, HALF, HEADS, D = 128, 16, 16, 128  # the tiny pack's head_dim, rope / 2, index heads and index head_dim
EPS = 1e-20
FLIPS = 1e-3  # fraction of codes allowed to differ from the torch stage's (rms_norm's rounding; see below)


def _gen(seed: int):
    import torch

    return torch.Generator().manual_seed(seed)


def _grid():
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import Fp4Grid

    return Fp4Grid.on(torch.device("cpu"))


def _rope(rows: int, seed: int):
    """cos / sin [rows, HALF] of random angles, the last three rows' the identity (cos 1, sin 0)."""
    import torch

    angles = torch.rand(rows, HALF, generator=_gen(seed)) * 50
    angles[-3:] = 0.0
    return angles.cos(), angles.sin()


def _spread(rows: int, n: int, seed: int):
    """Normal rows, each times 2**k for k in [-20, 20)."""
    import torch

    gen = _gen(seed)
    scale = torch.exp2(torch.randint(-20, 20, (rows, 1), generator=gen).float())
    return torch.randn(rows, n, generator=gen) * scale


def _special(n: int, block: int, peak: float, ties):
    """Rows of edge cases: zeros, -0.0, tiny and huge values, and blocks whose values land exactly on ties.

    A tie block holds peak * 2**k (its amax: its scale is exactly 2**k) and ties * 2**k, signs alternating.
    """
    import torch

    gen = _gen(7)
    rows = [torch.zeros(n), torch.full((n,), -0.0), torch.randn(n, generator=gen) * 1e-7,
            torch.randn(n, generator=gen) * 1e-30, torch.randn(n, generator=gen) * 3e3]  # fmt: skip
    for k in (-9, 0, 5):
        row = torch.empty(n)
        for b in range(n // block):
            pick = ties[torch.randint(len(ties), (block,), generator=gen)]
            sign = torch.where(torch.arange(block) % 2 == 0, 1.0, -1.0)
            row[b * block : (b + 1) * block] = pick * sign * 2.0**k
            row[b * block] = peak * 2.0**k
        rows.append(row)
    return torch.stack(rows)


def _e4m3_ties():
    """Every midpoint between neighbouring finite positive e4m3 values."""
    import torch

    v = torch.arange(127, dtype=torch.uint8).view(torch.float8_e4m3fn).float().sort().values
    return (v[1:] + v[:-1]) / 2


E2M1_TIES = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.0, 6.0)


def _neighbours(got, want, step, what: str) -> None:
    """Assert decoded values agree but for at most FLIPS of them, each within one code step."""
    differ = got != want
    assert bool(((got - want).abs() <= step)[differ].all()), f"{what}: a code moved past its neighbour"
    frac = float(differ.float().mean())
    assert frac <= FLIPS, f"{what}: {frac:.2e} of the codes differ"


@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "fp4_ue8m0"])
def test_pack_rows_are_torchs_bytes(tk, fp8):
    """window_rows' / key_rows' pack of rope(x) (the rms_norm skipped) gives torch's bytes, ties included."""
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import pack_fp4, pack_fp8
    from tfc.runtime.models.dsv41.fast.rope import apply_rope

    ties = _e4m3_ties().clamp(max=448) if fp8 else torch.tensor(E2M1_TIES)
    x = torch.cat((_spread(6, N, 1), _special(N, 32, 448.0 if fp8 else 6.0, ties)))
    cos, sin = _rope(x.shape[0], 2)
    got = tk.kv_pack._pack_rows(x, torch.ones(N), EPS, cos, sin, fp8, norm=False)
    rotated = apply_rope(x, cos, sin)
    want = pack_fp8(rotated) if fp8 else pack_fp4(rotated, 32, False, _grid())
    assert torch.equal(got, want)


def test_entry_rows_are_torchs_bytes(tk):
    """entry_rows: rope then e2m1 codes with an e4m3 scale per 16: torch's bytes.

    Ties of the codes and of the scales (amax / 6 on an e4m3 midpoint) included, amax / 6 an ulp below one
    (where the IEEE quotient rounds down and a product by 1/6 would round up), and scales past 448 (the 3e3
    row), which saturate as torch's cast does.
    """
    import torch
    from tfc.runtime.models.dsv41.fast.compressed import entry_rows

    e4m3, mids = torch.arange(1, 127, dtype=torch.uint8).view(torch.float8_e4m3fn).float(), _e4m3_ties()
    ties = mids[torch.linspace(0, len(mids) - 1, 8).long()] * 6
    below = torch.nextafter(6 * 1.1875 * torch.exp2(torch.arange(-6.0, 2.0)), torch.zeros(8))
    scales = []  # rows of 8 blocks, each led by its amax
    for seed, amax in enumerate((ties, e4m3[::16][:8] * 6, below)):
        blocks = (torch.rand(8, 16, generator=_gen(seed)) * 2 - 1) * amax[:, None]
        blocks[:, 0] = amax
        scales.append(blocks.reshape(N))
    latent = torch.cat((_spread(5, N, 3), _special(N, 16, 6.0, torch.tensor(E2M1_TIES)), torch.stack(scales)))
    cos, sin = _rope(latent.shape[0], 4)
    got = tk.kv_pack.entry_rows(latent, cos, sin, _grid())
    want = entry_rows.__wrapped__(latent, cos, sin, _grid())
    assert torch.equal(got, want)
    assert torch.equal(tk.kv_pack.entry_rows(latent[3:4], cos[3:4], sin[3:4], _grid()), got[3:4])


@pytest.mark.parametrize("fp8", [True, False], ids=["window_rows", "key_rows"])
def test_norm_rows_flip_at_most_neighbours(tk, fp8):
    """window_rows / key_rows whole against the torch stages: the same codes but for rare neighbour flips.

    The kernel sums the squares in another order than torch (its 1/sqrt is correctly rounded, as torch's CPU
    rsqrt), so a row's rstd, and with it a normalised value, can differ by an ulp or so. A code changes only
    where that value lies within an ulp of a boundary between two codes: about 2**-20 of the values for e4m3's
    3-bit mantissa, fewer for e2m1 (a block's scale moves only where its amax / max lies within an ulp of a
    power of two). Measured: no byte differs over 1,800 random rows each of 128 and 512 channels (1,188,000
    window and 612,000 key bytes), so FLIPS = 1e-3 of the codes leaves a wide margin; a value that differs
    must still be the neighbouring code (within one step at the block's scale).
    """
    import torch
    from tfc.runtime.models.dsv41.fast.attention import window_rows
    from tfc.runtime.models.dsv41.fast.compressed import key_rows

    rows, grid = 48, _grid()
    y = _spread(rows, N, 5)
    weight = torch.rand(N, generator=_gen(6)) + 0.5
    cos, sin = _rope(rows, 8)
    torch_stage = window_rows.__wrapped__ if fp8 else key_rows.__wrapped__  # the torch body, not a kernel
    want = torch_stage(y, weight, EPS, cos, sin) if fp8 else torch_stage(y, weight, EPS, cos, sin, grid)
    kernel = tk.kv_pack.window_rows if fp8 else tk.kv_pack.key_rows
    got = kernel(y, weight, EPS, cos, sin) if fp8 else kernel(y, weight, EPS, cos, sin, grid)
    a, b, step = code_steps(got, want, N, fp8, grid)
    _neighbours(a, b, step, "window_rows" if fp8 else "key_rows")
    one = [kernel(*args) for args in _row_args(fp8, y, weight, cos, sin, grid, (0, 17, rows - 1))]
    assert torch.equal(torch.cat(one), got[[0, 17, rows - 1]])


def _row_args(fp8, y, weight, cos, sin, grid, picks):
    """The arguments of window_rows / key_rows for each picked row alone."""
    for i in picks:
        s = slice(i, i + 1)
        yield (y[s], weight, EPS, cos[s], sin[s]) if fp8 else (y[s], weight, EPS, cos[s], sin[s], grid)


def test_index_query_is_torchs_bits(tk):
    """index_query: rope per head, then FP4 values, a UE8M0 scale per 32: torch's bits (signed zeros too)."""
    import torch
    from tfc.runtime.models.dsv41.fast.compressed import index_query

    rows = 4
    y = _spread(rows, HEADS * D, 9)
    y[1, :64] = 0.0
    y[2, 5 * D : 6 * D] = -0.0
    cos, sin = _rope(rows, 10)
    got = tk.kv_pack.index_query(y, HEADS, cos, sin, _grid())
    want = index_query.__wrapped__(y, HEADS, cos, sin, _grid())
    assert got.shape == want.shape == (rows, HEADS, D)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32))
    alone = tk.kv_pack.index_query(y[2:3], HEADS, cos[2:3], sin[2:3], _grid())
    assert torch.equal(alone.view(torch.int32), got[2:3].view(torch.int32))


def _index_inputs(rows: int, entries: int, seed: int):
    """(raw key rows [rows, entries, D/2 + D/32], FP4 queries [rows, HEADS, D], weights [rows, HEADS])."""
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import fake_fp4, pack_fp4

    grid, gen = _grid(), _gen(seed)
    scale = torch.exp2(torch.randint(-6, 6, (rows, entries, D // 32), generator=gen).float())
    keys = torch.randn(rows, entries, D, generator=gen) * scale.repeat_interleave(32, -1)
    q = fake_fp4(torch.randn(rows, HEADS, D, generator=gen) * 2, 32, grid)
    weights = torch.randn(rows, HEADS, generator=gen) * HEADS**-0.5
    return pack_fp4(keys, 32, False, grid), q, weights


def test_chunk_scores_are_torchs_and_ignore_the_chunk(tk):
    """chunk_scores: torch's scores exactly; an entry's score the same in any chunk, alone or among rows."""
    import torch
    from tfc.runtime.models.dsv41.fast.compressed import chunk_scores

    grid = _grid()
    raw, q, weights = _index_inputs(3, 70, 11)
    got = tk.index_scores.chunk_scores(raw, q, weights, grid)
    want = chunk_scores(raw, q, weights, grid)
    assert got.shape == (3, 70) and torch.equal(got, want)
    part = tk.index_scores.chunk_scores(raw[:, 9:30], q, weights, grid)  # a strided view, another chunk width
    assert torch.equal(part, got[:, 9:30])
    alone = tk.index_scores.chunk_scores(raw[1:2, 40:], q[1:2], weights[1:2], grid)
    assert torch.equal(alone, got[1:2, 40:])
    assert tk.index_scores.chunk_scores(raw[:, :0], q, weights, grid).shape == (3, 0)


def test_paged_scores_read_the_pages_in_place_with_the_gathered_bits(tk):
    """paged_scores: each row's entries read through its page ids from the pool give chunk_scores' bits on
    the same rows gathered first, and entry_scores (the step's) reads them so where stage kernels run."""
    import torch
    from tfc.runtime.models.dsv41.fast import compressed, stages

    grid, gen = _grid(), _gen(5)
    per_page, pool_pages = 8, 9
    pool, q, weights = _index_inputs(1, per_page * pool_pages, 6)
    pool = pool[0]  # [pages * per_page, bytes]
    q, weights = q.expand(3, -1, -1).clone(), weights.expand(3, -1).clone()
    pages = torch.stack([torch.randperm(pool_pages, generator=gen)[:5] for _ in range(3)])
    raw = pool.view(-1, per_page, pool.shape[-1])[pages].reshape(3, 5 * per_page, pool.shape[-1])
    want = tk.index_scores.chunk_scores(raw, q, weights, grid)
    got = tk.index_scores.paged_scores(pool, pages, per_page, q, weights)
    assert got.shape == (3, 40) and torch.equal(got, want)
    rv = type("View", (), {"pages": pages, "per_page": per_page, "entries": 5 * per_page})()
    was = stages._WHERE["kernels"]
    try:
        for where in ("cuda", "all"):  # the stage as written (CPU tensors), then the paged kernel
            stages.use_kernels(where)
            kernel = stages.stage_kernel("tfc.kernels.dsv41.index_scores:paged_scores", q)
            assert (kernel is None) == (where == "cuda")
            assert torch.equal(compressed.entry_scores(pool, rv, q, weights, grid), want), where
    finally:
        stages.use_kernels(was)
    with pytest.raises(ValueError, match="pages must be int"):
        tk.index_scores.paged_scores(pool, pages.float(), per_page, q, weights)


@pytest.mark.parametrize("group", [2, 3])
def test_pooled_matches_torch(tk, group):
    """pooled: the softmax-weighted sum of the group's ring rows, normalised, within 2e-6 of torch.

    The exps (numpy's against torch's) and the sum of squares (another order) may round differently: measured
    at most 9.5e-7 (2 ulp) over 800 rows of 512 with groups of 2 and 3, on values up to 5.6.
    """
    import torch
    from tfc.runtime.models.dsv41.fast.compressed import pooled

    gen = _gen(12 + group)
    rows, slots, ring = 5, 4, 7
    pending = torch.randn(2, slots, ring, N, generator=gen) * torch.tensor([1.0, 3.0]).view(2, 1, 1, 1)
    slot = torch.randint(0, slots, (rows, 1), generator=gen)
    at = (torch.randint(0, ring, (rows, 1), generator=gen) + torch.arange(group)) % ring
    weight = torch.rand(N, generator=gen) + 0.5
    got = tk.kv_pack.pooled(pending, slot, at, weight, EPS)
    want = pooled.__wrapped__(pending, slot, at, weight, EPS)
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    alone = tk.kv_pack.pooled(pending, slot[3:4], at[3:4], weight, EPS)
    assert torch.equal(alone, got[3:4])


def test_unsupported_shapes_raise(tk):
    """Shapes the kernels do not take are refused with a ValueError, not computed wrongly."""
    import torch

    kp, grid = tk.kv_pack, _grid()
    cos, sin = _rope(2, 0)
    with pytest.raises(ValueError):
        kp.window_rows(torch.zeros(2, 100), torch.ones(100), EPS, cos, sin)  # not a multiple of 32
    with pytest.raises(ValueError):
        kp.key_rows(torch.zeros(2, N, dtype=torch.float64), torch.ones(N), EPS, cos, sin, grid)
    with pytest.raises(ValueError):
        kp.entry_rows(torch.zeros(2, 16), cos, sin, grid)  # rope wider than the row
    with pytest.raises(ValueError):
        kp.index_query(torch.zeros(2, 16 * 48), 16, cos, sin, grid)  # heads of 48 channels
    raw, q, weights = _index_inputs(2, 4, 0)
    with pytest.raises(ValueError):
        tk.index_scores.chunk_scores(raw, q[:, :8], weights[:, :8], grid)  # 8 heads
    with pytest.raises(ValueError):
        index = torch.zeros(2, 1, dtype=torch.int64)
        kp.pooled(torch.zeros(2, 2, 4, N), index, index.expand(2, 2), torch.ones(64), EPS)  # weight of 64
