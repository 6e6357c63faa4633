"""The fast forward's stage kernels (kernels/dsv41/mhc_stages.py) against the torch stages and float64, interpreted.

Tiny shapes: hc 4, D 256 and the non-power-of-two 320, R 1 to 5. Each output is checked against the torch
stage it replaces (its torch code in fp32: the stage's __wrapped__) and against the reference maths in
float64, to 1e-6 of the output's largest float64 magnitude: the kernels sum in fp32 in another order (a row's
squares, a collapse over hc, the mix's K = hc * D products in 512-wide slices, the mix's rsqrt applied after
the product), so a few fp32 ulp (6e-8 each) of the row's scale, well under 1e-6 (an error of 1e-6 is ~16 ulp).
rope_heads is a copy and one rotation a pair, the torch stage's own roundings: bit for bit here (no fused
multiply-add under the interpreter). Row independence (a row alone gets the bits it gets in a batch) and
determinism (a rerun gets the same bits) are checked bit for bit.
"""

from __future__ import annotations

import pytest

HC = 4
TOL = 1e-6
EPS = 1e-20  # the Flash checkpoint's rms_norm_eps


def _close(got, want, tol=TOL):
    """Whether got is within tol of want, relative to want's largest magnitude."""
    import torch

    assert got.dtype == torch.float32 and got.shape == want.shape
    err = float((got.double() - want.double()).abs().max() / want.double().abs().max())
    assert err < tol, f"error {err:.3g} over {tol:.1g}"


def _gen(seed):
    """A seeded CPU generator."""
    import torch

    return torch.Generator().manual_seed(seed)


def _mix_inputs(rows, d, seed):
    """streams [rows, HC, d], fn [24, HC * d] (mixes of unit scale), scale [3], base [24]."""
    import torch

    g, m, k = _gen(seed), (2 + HC) * HC, HC * d
    streams = torch.randn(rows, HC, d, generator=g) * 2
    fn = torch.randn(m, k, generator=g) * k**-0.5
    return streams, fn, torch.rand(3, generator=g) + 0.5, torch.randn(m, generator=g)


def _stage_inputs(name, rows, d, seed):
    """The arguments of stage `name` at rows x d (rope_heads: 3 heads of d / 4 channels, a rope of d / 8)."""
    import torch

    g = _gen(seed)
    streams = torch.randn(rows, HC, d, generator=g)
    if name == "rms_norm":
        return (torch.randn(rows, d, generator=g) * 3, torch.randn(d, generator=g), EPS)
    if name == "collapse_norm":
        return (streams, torch.rand(rows, HC, generator=g), torch.randn(d, generator=g), EPS)
    if name == "hc_expand":
        return (torch.randn(rows, d, generator=g), streams, torch.rand(rows, HC, generator=g) * 2,
                torch.rand(rows, HC, HC, generator=g))  # fmt: skip
    if name == "engram_gate":
        return (
            streams,
            torch.randn(rows, (HC + 1) * d, generator=g),
            torch.randn(HC, d, generator=g),
            EPS,
            1e-6,
        )
    if name == "rope_heads":
        half = d // 16
        return (torch.randn(rows, d * 3 // 4, generator=g), 3, torch.randn(rows, half, generator=g),
                torch.randn(rows, half, generator=g))  # fmt: skip
    return _mix_inputs(rows, d, seed)


def _call(tk, name, args):
    """Stage `name` of the kernels on args, its outputs as a tuple."""
    if name == "hc_mix_logits":
        return tk.mhc_stages.hc_mix_logits(*args, norm_eps=EPS, hc_eps=1e-6, post_alpha=2.0)
    return (getattr(tk.mhc_stages, name)(*args),)


@pytest.mark.parametrize(("rows", "d"), [(1, 256), (5, 320)])
@pytest.mark.parametrize("wdtype", ["float32", "bfloat16"])
def test_rms_norm_matches_the_stage(tk, rows, d, wdtype):
    import torch
    from tfc.runtime.models.dsv41.fast import fp32
    from tfc.runtime.models.dsv41.reference import csa

    g = _gen(rows * 1000 + d)
    x = torch.randn(rows, d, generator=g) * 3
    w = torch.randn(d, generator=g).to(getattr(torch, wdtype))
    got = tk.mhc_stages.rms_norm(x, w, EPS)
    _close(got, fp32.rms_norm.__wrapped__(x, w, EPS))
    _close(got, csa.rms_norm(x.double(), w.double(), EPS))


@pytest.mark.parametrize(("rows", "d"), [(1, 256), (5, 320)])
def test_collapse_norm_matches_the_stage(tk, rows, d):
    import torch
    from tfc.runtime.models.dsv41.fast import fp32
    from tfc.runtime.models.dsv41.reference import csa, mhc

    g = _gen(rows * 1000 + d)
    streams = torch.randn(rows, HC, d, generator=g)
    pre = torch.rand(rows, HC, generator=g) + 1e-6
    w = torch.randn(d, generator=g).to(torch.bfloat16)
    got = tk.mhc_stages.collapse_norm(streams, pre, w, EPS)
    _close(got, fp32.collapse_norm.__wrapped__(streams, pre, w, EPS))
    _close(got, csa.rms_norm(mhc.hc_collapse(streams.double(), pre.double()), w.double(), EPS))


@pytest.mark.parametrize(("rows", "d"), [(1, 256), (5, 320)])
def test_hc_expand_matches_the_stage(tk, rows, d):
    import torch
    from tfc.runtime.models.dsv41.fast import fp32
    from tfc.runtime.models.dsv41.reference import mhc

    g = _gen(rows * 1000 + d)
    y, residual = torch.randn(rows, d, generator=g), torch.randn(rows, HC, d, generator=g)
    post, comb = torch.rand(rows, HC, generator=g) * 2, torch.rand(rows, HC, HC, generator=g)
    got = tk.mhc_stages.hc_expand(y, residual, post, comb)
    _close(got, fp32.hc_expand.__wrapped__(y, residual, post, comb))
    _close(got, mhc.hc_expand(y.double(), residual.double(), post.double(), comb.double()))


@pytest.mark.parametrize(("rows", "d"), [(1, 256), (5, 320)])
def test_hc_mix_logits_matches_the_stage(tk, rows, d):
    from tfc.runtime.models.dsv41.fast import fp32
    from tfc.runtime.models.dsv41.reference import mhc

    streams, fn, scale, base = _mix_inputs(rows, d, rows * 1000 + d)
    mix = {"norm_eps": EPS, "hc_eps": 1e-6, "post_alpha": 2.0}
    got = tk.mhc_stages.hc_mix_logits(streams, fn, scale, base, **mix)
    stage = fp32.hc_mix_logits.__wrapped__(streams, fn, scale, base, **mix)
    wide = mhc.hc_mix_logits(streams.double(), fn.double(), scale.double(), base.double(), **mix)
    for g, s, w in zip(got, stage, wide, strict=True):
        _close(g, s)
        _close(g, w)


@pytest.mark.parametrize(("rows", "d"), [(1, 256), (5, 320)])
def test_engram_gate_matches_the_stage(tk, rows, d):
    """Includes a zero key (a zero dot: the clamp's gate) and both signs of the dot."""
    import torch
    from tfc.runtime.models.dsv41.fast import engram

    g = _gen(rows * 1000 + d)
    streams = torch.randn(rows, HC, d, generator=g)
    kv = torch.randn(rows, (HC + 1) * d, generator=g)
    kv[0, d : 2 * d] = 0.0
    qk = torch.randn(HC, d, generator=g).to(torch.bfloat16)
    got = tk.mhc_stages.engram_gate(streams, kv, qk, EPS, 1e-6)
    _close(got, engram.engram_gate.__wrapped__(streams, kv, qk, EPS, 1e-6))
    wide = engram.engram_gate.__wrapped__(streams.double(), kv.double(), qk.double(), EPS, 1e-6)
    _close(got, wide)


@pytest.mark.parametrize(("heads", "d", "half"), [(3, 64, 16), (2, 512, 32), (5, 40, 4), (2, 32, 16)])
def test_rope_heads_matches_the_stage_bit_for_bit(tk, heads, d, half):
    import torch
    from tfc.runtime.models.dsv41.fast import attention
    from tfc.runtime.models.dsv41.reference.rope import apply_rope

    g = _gen(heads * d + half)
    y = torch.randn(3, heads * d, generator=g)
    cos, sin = torch.randn(3, half, generator=g), torch.randn(3, half, generator=g)
    got = tk.mhc_stages.rope_heads(y, heads, cos, sin)
    assert torch.equal(got, attention.rope_heads.__wrapped__(y, heads, cos, sin))
    wide = apply_rope(y.double().view(3, heads, d), cos.double()[:, None], sin.double()[:, None])
    _close(got, wide)


# Each stage's arguments that are rows (the others are weights or sizes).
ROW_ARGS = {"rms_norm": (0,), "collapse_norm": (0, 1), "hc_expand": (0, 1, 2, 3), "hc_mix_logits": (0,),
            "engram_gate": (0, 1), "rope_heads": (0, 2, 3)}  # fmt: skip


@pytest.mark.parametrize("name", sorted(ROW_ARGS))
def test_a_row_alone_gets_its_batch_bits_and_reruns_agree(tk, name):
    import torch

    args = _stage_inputs(name, 5, 320, 7)
    batch = _call(tk, name, args)
    assert all(torch.equal(a, b) for a, b in zip(batch, _call(tk, name, args), strict=True))
    for r in (0, 3, 4):
        alone = tuple(a[r : r + 1] if i in ROW_ARGS[name] else a for i, a in enumerate(args))
        for one, many in zip(_call(tk, name, alone), batch, strict=True):
            assert torch.equal(one[0], many[r]), f"row {r} of {name}"


def test_stages_refuse_what_they_cannot_take(tk):
    import torch

    st = tk.mhc_stages
    with pytest.raises(ValueError, match="float32"):
        st.rms_norm(torch.zeros(2, 8, dtype=torch.bfloat16), torch.ones(8), EPS)
    with pytest.raises(ValueError, match="supported"):
        st.rms_norm(torch.zeros(1, st.MAX_ROW + 1), torch.ones(st.MAX_ROW + 1), EPS)
    with pytest.raises(ValueError, match="weight"):
        st.collapse_norm(torch.zeros(2, HC, 8), torch.zeros(2, HC), torch.ones(9), EPS)
    with pytest.raises(ValueError, match="fit"):
        st.hc_expand(torch.zeros(2, 8), torch.zeros(2, HC, 8), torch.zeros(2, HC), torch.zeros(2, HC, 3))
    with pytest.raises(ValueError, match="want fn"):
        st.hc_mix_logits(torch.zeros(2, HC, 8), torch.zeros(24, 31), torch.ones(3), torch.zeros(24),
                         norm_eps=EPS, hc_eps=1e-6)  # fmt: skip
    with pytest.raises(ValueError, match="fit"):
        st.engram_gate(torch.zeros(2, HC, 8), torch.zeros(2, HC * 8), torch.zeros(HC, 8), EPS, 1e-6)
    with pytest.raises(ValueError, match="heads"):
        st.rope_heads(torch.zeros(2, 30), 4, torch.zeros(2, 2), torch.zeros(2, 2))
    with pytest.raises(ValueError, match="fit"):
        st.rope_heads(torch.zeros(2, 32), 4, torch.zeros(2, 5), torch.zeros(2, 5))
