"""DeepSeek-V4.1 forward modules against plain fp64 loop implementations written here."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tfc.runtime.models.dsv41.reference import csa
from tfc.runtime.models.dsv41.reference.attention import attend
from tfc.runtime.models.dsv41.reference.engram import engram_apply
from tfc.runtime.models.dsv41.reference.mhc import hc_collapse, hc_expand, hc_mix
from tfc.runtime.models.dsv41.reference.moe import moe
from tfc.runtime.models.dsv41.reference.quant import fake_quant_fp4, fake_quant_fp8
from tfc.runtime.models.dsv41.reference.rope import apply_rope, default_inv_freq, yarn_inv_freq
from tfc.runtime.models.dsv41.reference.state import new_compressor

F64 = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(g: torch.Generator, *shape: int, std: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g, dtype=F64) * std


# ---- quantisers -------------------------------------------------------------------------------------


def _e4m3_values() -> list[tuple[float, int]]:
    """Every finite non-negative e4m3fn magnitude with its code (bias 7, no infinities, 0x7f is NaN)."""
    out = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        out.append(((m / 8) * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7), code))
    return out


def _round_grid(v: float, grid: list[tuple[float, int]]) -> float:
    """Nearest grid magnitude to |v|, ties to the even code, with v's sign."""
    best = min(grid, key=lambda gc: (abs(abs(v) - gc[0]), gc[1] % 2))
    return math.copysign(best[0], v)


def _pow2_at_least(v: float) -> float:
    s = 1.0
    while s < v:
        s *= 2
    while s / 2 >= v:
        s /= 2
    return s


E2M1 = [(v, c) for c, v in enumerate((0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0))]


def _loop_fp8(x: np.ndarray, block: int) -> np.ndarray:
    grid, out = _e4m3_values(), np.empty_like(x)
    for r in range(x.shape[0]):
        for b0 in range(0, x.shape[1], block):
            blk = x[r, b0 : b0 + block].astype(np.float32)
            amax = max(float(np.abs(blk).max()), 1e-4)
            scale = _pow2_at_least(float(np.float32(amax) * np.float32(1 / 448)))
            for i, v in enumerate(blk):
                q = min(max(float(v) / scale, -448.0), 448.0)
                out[r, b0 + i] = _round_grid(q, grid) * scale
    return out


def _loop_fp4(x: np.ndarray, block: int, e4m3_scale: bool) -> np.ndarray:
    grid, out = _e4m3_values(), np.empty_like(x)
    for r in range(x.shape[0]):
        for b0 in range(0, x.shape[1], block):
            blk = x[r, b0 : b0 + block].astype(np.float32)
            amax = float(np.abs(blk).max())
            if e4m3_scale:
                scale = _round_grid(float(np.float32(max(amax, 6 * 2.0**-9)) / np.float32(6)), grid)
            else:
                scale = _pow2_at_least(float(np.float32(max(amax, 6 * 2.0**-126)) * np.float32(1 / 6)))
            for i, v in enumerate(blk):
                q = float(np.float32(min(max(float(v) / scale, -6.0), 6.0)))
                out[r, b0 + i] = _round_grid(q, E2M1) * scale
    return out


def test_fake_quant_fp8_matches_loop():
    x = _randn(_gen(1), 3, 64, std=3.0)
    x[1] *= 1e-3  # small blocks exercise the scale floor region
    got = fake_quant_fp8(x, 32)
    assert got.dtype == F64
    np.testing.assert_array_equal(got.numpy(), _loop_fp8(x.numpy(), 32))
    assert not torch.equal(got, x)


@pytest.mark.parametrize(("block", "e4m3"), [(32, False), (16, True)])
def test_fake_quant_fp4_matches_loop(block, e4m3):
    x = _randn(_gen(2), 3, 64, std=2.0)
    x[0, :8] = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0], dtype=F64)  # ties on the grid
    got = fake_quant_fp4(x, block, e4m3_scale=e4m3)
    np.testing.assert_allclose(got.numpy(), _loop_fp4(x.numpy(), block, e4m3), rtol=0, atol=0)


def test_quantisers_skip_unblockable_widths():
    x = _randn(_gen(3), 2, 24)
    assert torch.equal(fake_quant_fp8(x, 32), x)
    assert torch.equal(fake_quant_fp4(x, 16), x)


# ---- rope -------------------------------------------------------------------------------------------


def test_default_and_yarn_inv_freq_match_formulas():
    dim, theta = 16, 160000.0
    ref = [1.0 / theta ** (i / dim) for i in range(0, dim, 2)]
    np.testing.assert_allclose(default_inv_freq(theta, dim).numpy(), ref, rtol=1e-6)
    factor, orig, fast, slow = 4.0, 64, 32.0, 1.0

    def cdim(rot):
        return dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))

    low, high = max(math.floor(cdim(fast)), 0), min(math.ceil(cdim(slow)), dim - 1)
    yarn = []
    for i in range(dim // 2):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        extra = 1 - ramp
        yarn.append(ref[i] / factor * (1 - extra) + ref[i] * extra)
    got = yarn_inv_freq(theta, dim, factor, orig, fast, slow)
    np.testing.assert_allclose(got.numpy(), yarn, rtol=1e-6)
    assert not np.allclose(got.numpy(), ref)


@pytest.mark.parametrize("inverse", [False, True])
def test_apply_rope_rotates_adjacent_pairs_of_the_tail(inverse):
    g = _gen(4)
    x, ang = _randn(g, 5, 3, 20), _randn(g, 5, 4)
    got = apply_rope(x, ang.cos().unsqueeze(1), ang.sin().unsqueeze(1), inverse=inverse)
    ref = x.clone()
    for t in range(5):
        for h in range(3):
            for i in range(4):
                a = -ang[t, i] if inverse else ang[t, i]
                e, o = x[t, h, 12 + 2 * i], x[t, h, 13 + 2 * i]
                ref[t, h, 12 + 2 * i] = e * math.cos(a) - o * math.sin(a)
                ref[t, h, 13 + 2 * i] = e * math.sin(a) + o * math.cos(a)
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


# ---- mHC --------------------------------------------------------------------------------------------


def test_hc_mix_collapse_expand_match_loops():
    g, hc, d, t = _gen(5), 4, 8, 3
    streams = _randn(g, t, hc, d)
    fn, base, scale = _randn(g, (2 + hc) * hc, hc * d, std=0.3), _randn(g, (2 + hc) * hc), _randn(g, 3) + 1
    pre, post, comb = hc_mix(streams, fn, scale, base, norm_eps=1e-20, hc_eps=1e-6, iters=20, post_alpha=2.0)
    y = _randn(g, t, d)
    got_collapse, got_expand = hc_collapse(streams, pre), hc_expand(y, streams, post, comb)

    def sig(v):
        return 1 / (1 + math.exp(-v))

    for k in range(t):
        flat = streams[k].reshape(-1).tolist()
        r = 1 / math.sqrt(sum(v * v for v in flat) / len(flat) + 1e-20)
        m = [sum(fn[j, i].item() * flat[i] * r for i in range(len(flat))) for j in range(fn.shape[0])]
        p = [sig(m[i] * scale[0].item() + base[i].item()) + 1e-6 for i in range(hc)]
        q = [2 * sig(m[hc + i] * scale[1].item() + base[hc + i].item()) for i in range(hc)]
        c = [
            [m[2 * hc + i * hc + j] * scale[2].item() + base[2 * hc + i * hc + j].item() for j in range(hc)]
            for i in range(hc)
        ]
        c = [
            [math.exp(v - max(row)) / sum(math.exp(u - max(row)) for u in row) + 1e-6 for v in row]
            for row in c
        ]
        for it in range(20):
            if it:  # rows, then columns; the first pass normalises columns only
                c = [[v / (sum(row) + 1e-6) for v in row] for row in c]
            cols = [sum(c[i][j] for i in range(hc)) for j in range(hc)]
            c = [[c[i][j] / (cols[j] + 1e-6) for j in range(hc)] for i in range(hc)]
        np.testing.assert_allclose(pre[k].numpy(), p, rtol=1e-12)
        np.testing.assert_allclose(post[k].numpy(), q, rtol=1e-12)
        np.testing.assert_allclose(comb[k].numpy(), c, rtol=1e-10)
        for dd in range(d):
            ref_c = sum(p[i] * streams[k, i, dd].item() for i in range(hc))
            assert got_collapse[k, dd].item() == pytest.approx(ref_c, rel=1e-12, abs=1e-12)
            for out in range(hc):
                ref_e = q[out] * y[k, dd].item() + sum(
                    c[j][out] * streams[k, j, dd].item() for j in range(hc)
                )
                assert got_expand[k, out, dd].item() == pytest.approx(ref_e, rel=1e-10, abs=1e-10)


# ---- MoE --------------------------------------------------------------------------------------------


def test_moe_matches_per_token_loop():
    g, d, inter, e_n, k, t, limit = _gen(6), 8, 6, 5, 2, 7, 1.5
    w = {"f.gate.weight": _randn(g, e_n, d), "f.gate.bias": _randn(g, e_n, std=0.3)}
    for e in [*(f"experts.{i}" for i in range(e_n)), "shared_experts"]:
        w[f"f.{e}.w1"], w[f"f.{e}.w3"], w[f"f.{e}.w2"] = (
            _randn(g, d, inter),
            _randn(g, d, inter),
            _randn(g, inter, d),
        )
    x = _randn(g, t, d)
    got = moe(x, w.__getitem__, "f", e_n, k, 1.5, limit)

    def expert(name, v, scale=1.0):
        gate = [min(sum(v[a] * w[f"{name}.w1"][a, j].item() for a in range(d)), limit) for j in range(inter)]
        up = [
            min(max(sum(v[a] * w[f"{name}.w3"][a, j].item() for a in range(d)), -limit), limit)
            for j in range(inter)
        ]
        act = [scale * gate[j] / (1 + math.exp(-gate[j])) * up[j] for j in range(inter)]
        return [sum(act[j] * w[f"{name}.w2"][j, o].item() for j in range(inter)) for o in range(d)]

    clamped = 0
    for tok in range(t):
        v = x[tok].tolist()
        logits = [sum(v[a] * w["f.gate.weight"][e, a].item() for a in range(d)) for e in range(e_n)]
        s = [math.sqrt(math.log1p(math.exp(z))) for z in logits]
        chosen = sorted(range(e_n), key=lambda e: -(s[e] + w["f.gate.bias"][e].item()))[:k]
        total = sum(s[e] for e in chosen)
        ref = expert("f.shared_experts", v)
        for e in chosen:
            part = expert(f"f.experts.{e}", v, s[e] / (total + 1e-20) * 1.5)
            ref = [a + b for a, b in zip(ref, part, strict=True)]
        np.testing.assert_allclose(got[tok].numpy(), ref, rtol=1e-10, atol=1e-10)
        clamped += sum(
            abs(sum(v[a] * w["f.shared_experts.w3"][a, j].item() for a in range(d))) > limit
            for j in range(inter)
        )
    assert clamped > 0  # the clamp is exercised


# ---- Engram -----------------------------------------------------------------------------------------


def test_engram_gate_and_value_match_loop():
    g, t, hc, d, cols, hd = _gen(7), 3, 4, 8, 4, 5
    streams, rows = _randn(g, t, hc, d), _randn(g, t, cols, hd)
    wkv, qk = _randn(g, cols * hd, (hc + 1) * d, std=0.3), _randn(g, hc, d) + 1
    mask = torch.tensor([True, False, True])
    got = engram_apply(streams, rows, wkv, qk, eps=1e-20, clamp=1e-6, token_mask=mask)
    for k in range(t):
        e = rows[k].reshape(-1).tolist()
        kv = [sum(e[a] * wkv[a, j].item() for a in range(len(e))) for j in range((hc + 1) * d)]
        value = kv[hc * d :]
        for i in range(hc):
            key, h = kv[i * d : (i + 1) * d], streams[k, i].tolist()
            rh = 1 / math.sqrt(sum(v * v for v in h) / d + 1e-20)
            rk = 1 / math.sqrt(sum(v * v for v in key) / d + 1e-20)
            dot = sum(h[c] * qk[i, c].item() * key[c] for c in range(d)) * rh * rk / math.sqrt(d)
            gate = 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(dot), 1e-6)), dot))) if mask[k] else 0.0
            np.testing.assert_allclose(
                got[k, i].numpy(), [h[c] + gate * value[c] for c in range(d)], rtol=1e-10, atol=1e-12
            )


# ---- attention core and the compressed branch --------------------------------------------------------


def test_attend_with_window_compressed_entries_and_sinks():
    g, n, heads, dim, window = _gen(8), 4, 3, 8, 3
    q, keys, comp, sinks = _randn(g, n, heads, dim), _randn(g, 6, dim), _randn(g, 5, dim), _randn(g, heads)
    key_pos, q_pos = torch.arange(6), torch.arange(2, 6)
    bias = torch.zeros(n, 5).masked_fill(_randn(g, n, 5) > 0.3, float("-inf"))
    got = attend(q, keys, key_pos, q_pos, window, sinks, comp, bias)
    for i in range(n):
        for h in range(heads):
            cand = [(keys[j], j) for j in range(6) if q_pos[i] - window < j <= q_pos[i]]
            cand += [(comp[c], None) for c in range(5) if bias[i, c] == 0]
            logits = [float(q[i, h] @ v) / math.sqrt(dim) for v, _ in cand]
            top = max([*logits, sinks[h].item()])
            den = sum(math.exp(v - top) for v in logits) + math.exp(sinks[h].item() - top)
            ref = sum((math.exp(lg - top) / den) * v for lg, (v, _) in zip(logits, cand, strict=True))
            torch.testing.assert_close(got[i, h], ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("ratio", [1, 2])
def test_compressor_groups_across_chunks_match_one_shot_loop(ratio):
    g, n, dim = _gen(9), 9, 6
    kv, gate, norm = _randn(g, n, dim), _randn(g, n, dim), _randn(g, dim) + 1
    state = new_compressor(ratio, dim, None, F64, "cpu")
    latents, firsts = [], []
    for a, b in [(0, 1), (1, 4), (4, 5), (5, 9)]:
        lat, first = csa.compress(state, kv[a:b], gate[a:b] if ratio > 1 else None, norm, 1e-20)
        if lat is not None:
            firsts.append(first)
            latents.append(lat)
            state.entries.append(lat)  # the attention layer appends the rotated entries
    got = torch.cat(latents)
    assert got.shape[0] == n // ratio and firsts[0] == 0
    for grp in range(n // ratio):
        toks = range(grp * ratio, grp * ratio + ratio)
        pooled = []
        for c in range(dim):
            ex = [math.exp(gate[t, c].item()) for t in toks] if ratio > 1 else [1.0]
            pooled.append(sum(e / sum(ex) * kv[t, c].item() for e, t in zip(ex, toks, strict=True)))
        r = 1 / math.sqrt(sum(v * v for v in pooled) / dim + 1e-20)
        np.testing.assert_allclose(
            got[grp].numpy(), [norm[c].item() * pooled[c] * r for c in range(dim)], rtol=1e-12
        )
    assert state.pending_kv.shape[0] == n % ratio


def test_index_scores_visibility_candidates_and_topk_match_loops():
    g, n, heads, hd, groups, qr, d = _gen(10), 5, 4, 32, 11, 6, 7
    q_res, x, keys = _randn(g, n, qr), _randn(g, n, d), _randn(g, groups, hd)
    wq_b, wproj = _randn(g, qr, heads * hd), _randn(g, heads, d)
    ang = _randn(g, n, 8)
    cos, sin = ang.cos(), ang.sin()
    got = csa.index_scores(q_res, x, cos, sin, keys, wq_b, wproj, heads)
    q = apply_rope((q_res @ wq_b).unflatten(-1, (heads, hd)), cos.unsqueeze(1), sin.unsqueeze(1))
    q = fake_quant_fp4(q, 32)
    for i in range(n):
        w = [float(x[i] @ wproj[h]) / math.sqrt(heads) for h in range(heads)]
        for grp in range(groups):
            ref = sum(w[h] * max(float(q[i, h] @ keys[grp]), 0.0) / math.sqrt(hd) for h in range(heads))
            assert got[i, grp].item() == pytest.approx(ref, rel=1e-10, abs=1e-12)
    positions = torch.tensor([3, 8, 13, 17, 21])
    scores, lens = csa.visible(got, positions, 2)
    assert lens.squeeze(-1).tolist() == [2, 4, 7, 9, 11]
    cand = csa.candidate_blocks(scores, lens, 2, 2)
    bias = csa.topk_bias(scores, 3)
    for i in range(n):
        vis = [grp for grp in range(groups) if grp < int(lens[i])]
        blocks = {}
        for grp in vis:
            blocks[grp // 2] = max(blocks.get(grp // 2, -math.inf), scores[i, grp].item())
        blocks[(int(lens[i]) - 1) // 2] = math.inf
        best = sorted(blocks, key=lambda b: (-blocks[b], b))[:2]
        assert [grp for grp in range(groups) if cand[i, grp]] == [
            grp for grp in range(groups) if grp // 2 in best
        ]
        top = sorted(vis, key=lambda grp: (-scores[i, grp].item(), grp))[:3]
        assert sorted(torch.where(bias[i] == 0)[0].tolist()) == sorted(top)


# ---- config -----------------------------------------------------------------------------------------


def _flash_text() -> dict:
    """The DeepSeek-V4.1-Flash text_config values the modes depend on (spec section 1.3)."""
    from support.dsv41_random import TINY_TEXT_CONFIG

    return dict(
        TINY_TEXT_CONFIG,
        num_hidden_layers=40,
        compress_ratios=[0, 0] + [2] * 18 + [1] * 20 + [0, 0, 0],
        kv_source_layer_ids=[2, 8, 14, 20],
        index_source_layer_ids=[2, 8, 14, 20, 24, 28, 32, 36],
        candidate_source_layer_id=20,
        engram_layer_ids=[1, 14],
        num_nextn_predict_layers=3,
    )


def test_flash_layer_modes_match_the_spec_table():
    from tfc.fixtures.layer_modes import layer_mode_records
    from tfc.runtime.models.dsv41.config import config_from_dict

    raw = {"text_config": _flash_text(), "bos_token_id": 0, "eos_token_id": 1}
    cfg = config_from_dict(raw, layer_mode_records(raw))
    got = {
        m.layer: (m.mode, m.compress_ratio, m.kv_source, m.index_source, m.uses_candidates) for m in cfg.modes
    }
    want = {0: ("swa", 0, None, None, False), 1: ("swa", 0, None, None, False), 2: ("full", 2, 2, 2, False)}
    want |= {i: ("reuse", 2, 2, 2, False) for i in range(3, 8)} | {8: ("full", 2, 8, 8, False)}
    want |= {i: ("reuse", 2, 8, 8, False) for i in range(9, 14)} | {14: ("full", 2, 14, 14, False)}
    want |= {i: ("reuse", 2, 14, 14, False) for i in range(15, 20)} | {20: ("full", 1, 20, 20, False)}
    want |= {i: ("reuse", 1, 20, 20, False) for i in range(21, 24)}
    for src in (24, 28, 32, 36):
        want |= {src: ("reindex", 1, 20, src, True)} | {
            i: ("reuse", 1, 20, src, False) for i in range(src + 1, src + 4)
        }
    assert got == want
    assert [m.layer for m in cfg.modes if m.engram] == [1, 14] and cfg.layer_mode(20).is_candidate_source
    assert cfg.eos_token_id == 1 and cfg.engram_cols == (3 - 1) * 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"scoring_func": "softmax"}, "sqrtsoftplus"),
        ({"compress_ratios": [0, 4] + [2] * 18 + [1] * 20}, "compress_ratios"),
        (
            {"compress_ratios": [0, 0] + [2] * 19 + [1] * 19},
            "record 20: compress ratio 1, the config's compress_ratios[20] = 2",
        ),
        ({"engram_layer_ids": [1]}, "engram True disagrees"),
        ({"candidate_source_layer_id": 2}, "candidate source layers [20], the config [2]"),
    ],
)
def test_bad_configs_are_refused_in_one_line(change, words):
    """Source-layer rules are packs' (tests/test_packs_config.py); the runtime checks config against records."""
    from tfc.fixtures.layer_modes import layer_mode_records
    from tfc.runtime.models.dsv41.config import Dsv41ConfigError, config_from_dict

    records = layer_mode_records({"text_config": _flash_text()})
    with pytest.raises(Dsv41ConfigError) as refused:
        config_from_dict({"text_config": _flash_text() | change}, records)
    assert words in str(refused.value) and "\n" not in str(refused.value)
