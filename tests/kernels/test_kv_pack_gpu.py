"""The packing and scoring stage kernels (kernels/dsv41/kv_pack.py) at DeepSeek-V4.1-Flash shapes on a CUDA GPU.

The checks of tests/kernels/interpret/test_triton_kv_pack.py at n = 512 (rope 64), index keys of 128 channels,
32 index heads of 128 and R = 16 (decode) or 2048 (prefill). Where the kernel must give torch's bits (the
packers, entry_rows, index_query, chunk_scores) the reference is the torch stage run on the CPU, which divides
as IEEE does: CUDA torch turns a division by a Python number (an entry's amax / 6) into a product by its
reciprocal. window_rows, key_rows and pooled are held against the torch stages on the GPU they replace, within
bounds: there the norm's 1/sqrt is CUDA's approximate rsqrtf and exp the GPU's, so a code may flip to its
neighbour. The torch stages run as their bodies (`__wrapped__`): the `@fused` wrappers may run these kernels.
"""

from __future__ import annotations

import pytest
from support.stage_checks import code_steps

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

N, HALF, KEY = 512, 32, 128  # head_dim, rope / 2, the index key's width
HEADS, D = 32, 128  # index heads, index head_dim
EPS = 1e-20
FLIPS = 1e-3  # fraction of codes allowed to differ from the CUDA torch stage's (see the interpreted tests)
ROWS = [16, 2048]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _grid(device: str):
    from tfc.runtime.models.dsv41.fast.kv.rows import Fp4Grid

    return Fp4Grid.on(torch.device(device))


def _rope(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin [rows, HALF] (CPU) of random angles, the first row's the identity."""
    angles = torch.rand(rows, HALF, generator=_gen(seed)) * 1e4
    angles[0] = 0.0
    return angles.cos(), angles.sin()


def _spread(rows: int, n: int, seed: int) -> torch.Tensor:
    """Normal rows (CPU), each times 2**k for k in [-20, 20); a zero row and a -0.0 row first."""
    gen = _gen(seed)
    scale = torch.exp2(torch.randint(-20, 20, (rows, 1), generator=gen).float())
    x = torch.randn(rows, n, generator=gen) * scale
    x[0], x[1] = 0.0, -0.0
    return x


def _differences(got: torch.Tensor, want: torch.Tensor, source: torch.Tensor) -> str:
    """How many elements differ, the first few (index, got, want), their source rows' leading values."""
    at = (got != want).nonzero()
    first = [(tuple(i.tolist()), got[tuple(i)].item(), want[tuple(i)].item()) for i in at[:6]]
    rows = sorted({int(i[0]) for i in at[:6]})
    return f"{len(at)} of {got.numel()} differ, first {first}; source rows {rows}: " + "; ".join(
        f"{r}: {source[r, :8].tolist()}" for r in rows[:2]
    )


def _alone(fn, picks, *tensors):
    """fn's result for each picked row alone, concatenated (the row arguments sliced, the others passed)."""
    return torch.cat([fn(*(t[i : i + 1] for t in tensors)) for i in picks])


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("fp8", [True, False], ids=["fp8", "fp4_ue8m0"])
def test_pack_rows_are_torchs_bytes(rows, fp8):
    """The window / key pack of rope(x) (rms_norm skipped) gives torch's bytes, alone or among rows."""
    from tfc.kernels.dsv41 import kv_pack as kp
    from tfc.runtime.models.dsv41.fast.kv.rows import pack_fp4, pack_fp8
    from tfc.runtime.models.dsv41.fast.rope import apply_rope

    n = N if fp8 else KEY
    x = _spread(rows, n, 1)
    cos, sin = _rope(rows, 2)
    ones = torch.ones(n, device="cuda")
    got = kp._pack_rows(x.cuda(), ones, EPS, cos.cuda(), sin.cuda(), fp8, norm=False)
    rotated = apply_rope(x, cos, sin)
    want = pack_fp8(rotated) if fp8 else pack_fp4(rotated, 32, False, _grid("cpu"))
    assert torch.equal(got.cpu(), want)
    picks = (0, 3, rows - 1)
    alone = _alone(lambda a, c, s: kp._pack_rows(a, ones, EPS, c, s, fp8, norm=False), picks,
                   x.cuda(), cos.cuda(), sin.cuda())  # fmt: skip
    assert torch.equal(alone, got[list(picks)])


@pytest.mark.parametrize("rows", ROWS)
def test_entry_rows_are_torchs_bytes(rows):
    """entry_rows: rope then e2m1 codes with an e4m3 scale per 16, the bytes of torch's stage (on the CPU)."""
    from tfc.kernels.dsv41 import kv_pack as kp
    from tfc.runtime.models.dsv41.fast.compressed import entry_rows

    latent = _spread(rows, N, 3)
    # row 2: each block's amax / 6 an ulp under an e4m3 tie, where only the IEEE quotient rounds down
    amax = torch.nextafter(6 * 1.1875 * torch.exp2(torch.arange(-6.0, 2.0)), torch.zeros(8)).repeat(4)
    latent[2] = (torch.rand(32, 16, generator=_gen(0)) * amax[:, None]).reshape(N)
    latent[2, ::16] = amax
    cos, sin = _rope(rows, 4)
    grid = _grid("cuda")
    got = kp.entry_rows(latent.cuda(), cos.cuda(), sin.cuda(), grid)
    want = entry_rows.__wrapped__(latent, cos, sin, _grid("cpu"))
    assert torch.equal(got.cpu(), want), _differences(got.cpu(), want, latent)
    assert torch.equal(kp.entry_rows(latent.cuda(), cos.cuda(), sin.cuda(), grid), got)  # deterministic
    latent, cos, sin = latent.cuda(), cos.cuda(), sin.cuda()
    alone = _alone(lambda a, c, s: kp.entry_rows(a, c, s, grid), (2, rows - 1), latent, cos, sin)
    assert torch.equal(alone, got[[2, rows - 1]])


@pytest.mark.parametrize("rows", ROWS)
@pytest.mark.parametrize("fp8", [True, False], ids=["window_rows", "key_rows"])
def test_norm_rows_flip_at_most_neighbours(rows, fp8):
    """window_rows / key_rows against the CUDA torch stages: the same codes but for rare neighbour flips."""
    from tfc.kernels.dsv41 import kv_pack as kp
    from tfc.runtime.models.dsv41.fast.attention import window_rows
    from tfc.runtime.models.dsv41.fast.compressed import key_rows

    n, grid = (N if fp8 else KEY), _grid("cuda")
    y = _spread(rows, n, 5).cuda()
    weight = (torch.rand(n, generator=_gen(6)) + 0.5).cuda()
    cos, sin = (t.cuda() for t in _rope(rows, 8))
    torch_stage = window_rows.__wrapped__ if fp8 else key_rows.__wrapped__  # the torch body, not a kernel
    want = torch_stage(y, weight, EPS, cos, sin) if fp8 else torch_stage(y, weight, EPS, cos, sin, grid)
    got = kp.window_rows(y, weight, EPS, cos, sin) if fp8 else kp.key_rows(y, weight, EPS, cos, sin, grid)
    a, b, step = code_steps(got, want, n, fp8, grid)
    differ = a != b
    assert bool(((a - b).abs() <= step)[differ].all()), "a code moved past its neighbour"
    assert float(differ.float().mean()) <= FLIPS
    if fp8:
        alone = _alone(lambda a, c, s: kp.window_rows(a, weight, EPS, c, s), (0, rows - 1), y, cos, sin)
    else:
        alone = _alone(lambda a, c, s: kp.key_rows(a, weight, EPS, c, s, grid), (0, rows - 1), y, cos, sin)
    assert torch.equal(alone, got[[0, rows - 1]])


@pytest.mark.parametrize("rows", ROWS)
def test_index_query_is_torchs_bits(rows):
    """index_query at 32 heads of 128: torch's bits (signed zeros included), alone or among rows."""
    from tfc.kernels.dsv41 import kv_pack as kp
    from tfc.runtime.models.dsv41.fast.compressed import index_query

    y = _spread(rows, HEADS * D, 10)
    cos, sin = _rope(rows, 11)
    grid = _grid("cuda")
    got = kp.index_query(y.cuda(), HEADS, cos.cuda(), sin.cuda(), grid)
    want = index_query.__wrapped__(y, HEADS, cos, sin, _grid("cpu"))
    got_bits, want_bits = got.cpu().view(torch.int32), want.view(torch.int32)  # signed zeros differ here
    assert torch.equal(got_bits, want_bits), _differences(got_bits, want_bits, y)
    y, cos, sin = y.cuda(), cos.cuda(), sin.cuda()
    alone = _alone(lambda a, c, s: kp.index_query(a, HEADS, c, s, grid), (1, rows - 1), y, cos, sin)
    assert torch.equal(alone.view(torch.int32), got[[1, rows - 1]].view(torch.int32))


@pytest.mark.parametrize(("rows", "entries"), [(16, 4096), (2048, 300)])
def test_chunk_scores_are_torchs_and_ignore_the_chunk(rows, entries):
    """chunk_scores: torch's scores exactly; an entry's score the same in any chunk, alone or among rows."""
    from tfc.kernels.dsv41 import index_scores as kp
    from tfc.runtime.models.dsv41.fast.compressed import chunk_scores
    from tfc.runtime.models.dsv41.fast.kv.rows import fake_fp4, pack_fp4

    cpu, gen = _grid("cpu"), _gen(12)
    scale = torch.exp2(torch.randint(-6, 6, (rows, entries, D // 32), generator=gen).float())
    keys = torch.randn(rows, entries, D, generator=gen) * scale.repeat_interleave(32, -1)
    raw = pack_fp4(keys, 32, False, cpu)
    q = fake_fp4(torch.randn(rows, HEADS, D, generator=gen) * 2, 32, cpu)
    weights = torch.randn(rows, HEADS, generator=gen) * HEADS**-0.5
    grid = _grid("cuda")
    raw_d, q_d, w_d = raw.cuda(), q.cuda(), weights.cuda()
    got = kp.chunk_scores(raw_d, q_d, w_d, grid)
    want = chunk_scores(raw, q, weights, cpu)
    assert torch.equal(got.cpu(), want)
    lo, hi = entries // 3, entries // 3 + 177
    assert torch.equal(kp.chunk_scores(raw_d[:, lo:hi], q_d, w_d, grid), got[:, lo:hi])  # a strided view
    alone = kp.chunk_scores(raw_d[rows - 1 :], q_d[rows - 1 :], w_d[rows - 1 :], grid)
    assert torch.equal(alone, got[rows - 1 :])


@pytest.mark.parametrize(("rows", "pages"), [(16, 256), (2048, 20)])
def test_paged_scores_are_the_gathered_ones(rows, pages):
    """paged_scores: the entries read through each row's page ids give chunk_scores' bits on them gathered."""
    from tfc.kernels.dsv41 import index_scores as kp
    from tfc.runtime.models.dsv41.fast.kv.rows import fake_fp4, pack_fp4

    cpu, gen, per_page, pool_pages = _grid("cpu"), _gen(13), 16, 512
    keys = torch.randn(pool_pages * per_page, D, generator=gen)
    pool = pack_fp4(keys, 32, False, cpu).cuda()
    q = fake_fp4(torch.randn(rows, HEADS, D, generator=gen) * 2, 32, cpu).cuda()
    weights = (torch.randn(rows, HEADS, generator=gen) * HEADS**-0.5).cuda()
    ids = torch.randint(0, pool_pages, (rows, pages), generator=gen).cuda()
    raw = pool.view(-1, per_page, pool.shape[-1])[ids].reshape(rows, pages * per_page, pool.shape[-1])
    want = kp.chunk_scores(raw, q, weights, _grid("cuda"))
    assert torch.equal(kp.paged_scores(pool, ids, per_page, q, weights), want)


@pytest.mark.parametrize("rows", ROWS)
def test_pooled_matches_torch(rows):
    """pooled (groups of 2 ring rows of 512) within 1e-5 of the CUDA torch stage; a row's bits its own."""
    from tfc.kernels.dsv41 import kv_pack as kp
    from tfc.runtime.models.dsv41.fast.compressed import pooled

    gen = _gen(13)
    slots, ring = 9, rows + 2
    pending = torch.randn(2, slots, ring, N, generator=gen) * torch.tensor([1.0, 3.0]).view(2, 1, 1, 1)
    slot = torch.randint(0, slots, (rows, 1), generator=gen)
    at = (torch.randint(0, ring, (rows, 1), generator=gen) + torch.arange(2)) % ring
    weight = torch.rand(N, generator=gen) + 0.5
    pending, slot, at, weight = pending.cuda(), slot.cuda(), at.cuda(), weight.cuda()
    got = kp.pooled(pending, slot, at, weight, EPS)
    want = pooled.__wrapped__(pending, slot, at, weight, EPS)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    alone = _alone(lambda s, a: kp.pooled(pending, s, a, weight, EPS), (0, rows - 1), slot, at)
    assert torch.equal(alone, got[[0, rows - 1]])
