"""The stage kernels (kernels/dsv41/mhc_stages.py) at DeepSeek-V4.1-Flash shapes on a CUDA GPU (skipped without one).

hc 4, D 5120 (fn [24, 20480]), norms of 5120 / 1280 / 512, 64 query heads of 512 with a 64-channel rope, at R
16 (decode) and 2048 (prefill). Each output is checked against the torch stage it replaces (its torch code in
fp32 on the GPU: the stage's __wrapped__) and the reference maths in float64, relative to the output's largest
float64 magnitude: 2e-6 for the norms, hc_expand and the Engram gate (fp32 sums in another order, fused
multiply-adds, the sigmoid's approximate exp: a few ulp); 1e-5 for the mix (20480-term fp32 products summed as
512-term chains and a tree of 40, where TF32 would miss by ~1e-3); 1e-6 for rope_heads' rotated pairs (a fused
multiply-add at most), its copied channels exact. The 16 rows from row 1000 of a 2048-row batch, run alone,
give the batch's bits; reruns give the same bits; a CUDA graph of all six stages replays the eager bits.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

HC, D, EPS = 4, 5120, 1e-20
HEADS, HEAD_DIM, HALF = 64, 512, 32
MIX = {"norm_eps": EPS, "hc_eps": 1e-6, "post_alpha": 2.0}


def _err(got, want):
    """The largest |got - want| over want's largest magnitude (float64)."""
    assert got.dtype == torch.float32 and got.shape == want.shape and got.is_cuda
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


def _inputs(rows, seed=0):
    """Flash-shaped inputs of every stage at `rows` rows, on the GPU."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, device="cuda") * scale

    def rand(*shape):
        return torch.rand(*shape, generator=g, device="cuda")

    m, k = (2 + HC) * HC, HC * D
    return {
        "streams": randn(rows, HC, D, scale=2.0),
        "pre": rand(rows, HC) + 1e-6,
        "norm": randn(D).to(torch.bfloat16),
        "y": randn(rows, D),
        "post": rand(rows, HC) * 2,
        "comb": rand(rows, HC, HC),
        "fn": randn(m, k, scale=k**-0.5),
        "scale": rand(3) + 0.5,
        "base": randn(m),
        "kv": randn(rows, (HC + 1) * D),
        "qk": randn(HC, D).to(torch.bfloat16),
        "q": randn(rows, HEADS * HEAD_DIM),
        "cos": randn(rows, HALF),
        "sin": randn(rows, HALF),
    }


def _all(st, a):
    """Every stage of module `st` on inputs `a`: a flat tuple of outputs."""
    return (
        st.rms_norm(a["y"], a["norm"], EPS),
        st.collapse_norm(a["streams"], a["pre"], a["norm"], EPS),
        st.hc_expand(a["y"], a["streams"], a["post"], a["comb"]),
        *st.hc_mix_logits(a["streams"], a["fn"], a["scale"], a["base"], **MIX),
        st.engram_gate(a["streams"], a["kv"], a["qk"], EPS, 1e-6),
        st.rope_heads(a["q"], HEADS, a["cos"], a["sin"]),
    )


@pytest.mark.parametrize("rows", [16, 2048])
@pytest.mark.parametrize(
    ("n", "wdtype"), [(5120, torch.bfloat16), (1280, torch.float32), (512, torch.bfloat16)]
)
def test_rms_norm_flash(rows, n, wdtype):
    from tfc.kernels.dsv41.mhc_stages import rms_norm
    from tfc.runtime.models.dsv41.fast import fp32
    from tfc.runtime.models.dsv41.reference import csa

    g = torch.Generator(device="cuda").manual_seed(n + rows)
    x = torch.randn(rows, n, generator=g, device="cuda") * 3
    w = torch.randn(n, generator=g, device="cuda").to(wdtype)
    got = rms_norm(x, w, EPS)
    assert _err(got, fp32.rms_norm.__wrapped__(x, w, EPS)) < 2e-6
    assert _err(got, csa.rms_norm(x.double(), w.double(), EPS)) < 2e-6


@pytest.mark.parametrize("rows", [16, 2048])
def test_collapse_norm_and_expand_flash(rows):
    from tfc.kernels.dsv41.mhc_stages import collapse_norm, hc_expand
    from tfc.runtime.models.dsv41.fast import fp32
    from tfc.runtime.models.dsv41.reference import csa, mhc

    a = _inputs(rows, 1)
    s, pre, w = a["streams"], a["pre"], a["norm"]
    got = collapse_norm(s, pre, w, EPS)
    assert _err(got, fp32.collapse_norm.__wrapped__(s, pre, w, EPS)) < 2e-6
    assert _err(got, csa.rms_norm(mhc.hc_collapse(s.double(), pre.double()), w.double(), EPS)) < 2e-6
    y, post, comb = a["y"], a["post"], a["comb"]
    got = hc_expand(y, s, post, comb)
    assert _err(got, fp32.hc_expand.__wrapped__(y, s, post, comb)) < 2e-6
    assert _err(got, mhc.hc_expand(y.double(), s.double(), post.double(), comb.double())) < 2e-6


@pytest.mark.parametrize("rows", [16, 2048])
def test_hc_mix_logits_flash(rows):
    from tfc.kernels.dsv41.mhc_stages import hc_mix_logits
    from tfc.runtime.models.dsv41.fast import fp32
    from tfc.runtime.models.dsv41.reference import mhc

    a = _inputs(rows, 2)
    s, fn, scale, base = a["streams"], a["fn"], a["scale"], a["base"]
    got = hc_mix_logits(s, fn, scale, base, **MIX)
    stage = fp32.hc_mix_logits.__wrapped__(s, fn, scale, base, **MIX)
    wide = mhc.hc_mix_logits(s.double(), fn.double(), scale.double(), base.double(), **MIX)
    for g, t, w in zip(got, stage, wide, strict=True):
        assert _err(g, w) < 1e-5
        assert _err(g, t) < 1e-5


@pytest.mark.parametrize("rows", [16, 2048])
def test_engram_gate_flash(rows):
    from tfc.kernels.dsv41.mhc_stages import engram_gate
    from tfc.runtime.models.dsv41.fast import engram

    a = _inputs(rows, 3)
    s, kv, qk = a["streams"], a["kv"], a["qk"]
    kv[0, D : 2 * D] = 0.0  # a zero dot: the clamp's gate
    got = engram_gate(s, kv, qk, EPS, 1e-6)
    assert _err(got, engram.engram_gate.__wrapped__(s, kv, qk, EPS, 1e-6)) < 2e-6
    assert _err(got, engram.engram_gate.__wrapped__(s.double(), kv.double(), qk.double(), EPS, 1e-6)) < 2e-6


@pytest.mark.parametrize("rows", [16, 2048])
def test_rope_heads_flash(rows):
    from tfc.kernels.dsv41.mhc_stages import rope_heads
    from tfc.runtime.models.dsv41.fast import attention
    from tfc.runtime.models.dsv41.reference.rope import apply_rope

    a = _inputs(rows, 4)
    q, cos, sin = a["q"], a["cos"], a["sin"]
    got = rope_heads(q, HEADS, cos, sin)
    stage = attention.rope_heads.__wrapped__(q, HEADS, cos, sin)
    nope = HEAD_DIM - 2 * HALF
    assert torch.equal(got[..., :nope], q.view(rows, HEADS, HEAD_DIM)[..., :nope])
    assert _err(got, stage) < 1e-6
    wide = apply_rope(q.double().view(rows, HEADS, HEAD_DIM), cos.double()[:, None], sin.double()[:, None])
    assert _err(got, wide) < 1e-6


def test_rows_alone_get_their_batch_bits_and_reruns_agree():
    from tfc.kernels.dsv41 import mhc_stages

    big = _inputs(2048, 5)
    rows = slice(1000, 1016)
    # per-row inputs sliced; the weights (norm, fn, scale, base, qk) stay whole
    small = {
        name: t[rows].contiguous() if name not in ("norm", "fn", "scale", "base", "qk") else t
        for name, t in big.items()
    }
    batch = _all(mhc_stages, big)
    assert all(torch.equal(x, y) for x, y in zip(batch, _all(mhc_stages, big), strict=True))
    for i, (one, many) in enumerate(zip(_all(mhc_stages, small), batch, strict=True)):
        assert torch.equal(one, many[rows]), f"output {i}"


def test_stages_replay_in_a_cuda_graph():
    from tfc.kernels.dsv41 import mhc_stages

    a = _inputs(16, 6)
    eager = _all(mhc_stages, a)  # also compiles every kernel before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _all(mhc_stages, a)
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(x, y) for x, y in zip(captured, eager, strict=True))
