"""The stateful DeepSeek-V4.1 forward against an independent one-shot fp64 forward written here.

The one-shot forward sees the whole sequence at once (no caches, no chunks): groups, compressed entries,
index keys, candidate blocks and top-k sets are built per token with plain loops, straight from the
formulas of HF transformers deepseek_v41 (revision 0a2080b4). Only the quantisers and the rope
frequency tables are shared with tfc; both have their own loop tests in test_dsv41_modules.py.
"""

from __future__ import annotations

import itertools
import math

import torch
from support.dsv41_random import random_weights, tiny_config_dict
from tfc.fixtures.layer_modes import layer_mode_records
from tfc.runtime.models.dsv41.config import config_from_dict
from tfc.runtime.models.dsv41.reference.forward import Dsv41Model
from tfc.runtime.models.dsv41.reference.quant import fake_quant_fp4, fake_quant_fp8
from tfc.runtime.models.dsv41.reference.rope import default_inv_freq, yarn_inv_freq

F64 = torch.float64


def _rms(v, weight, eps):
    return weight * v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)


def _rot(v, pos, inv, sign=1.0):
    """Rotate the trailing 2*len(inv) channels of v [..., d] at one integer position."""
    r = 2 * len(inv)
    ang = sign * pos * inv
    c, s = torch.cos(ang), torch.sin(ang)
    pairs = v[..., v.shape[-1] - r :].reshape(*v.shape[:-1], r // 2, 2)
    e, o = pairs[..., 0], pairs[..., 1]
    turned = torch.stack((e * c - o * s, e * s + o * c), dim=-1).reshape(*v.shape[:-1], r)
    return torch.cat((v[..., : v.shape[-1] - r], turned), dim=-1)


def _mix(s, fn, scale, base, t):
    hc = s.shape[0]
    flat = s.reshape(-1)
    m = fn @ (flat / torch.sqrt((flat * flat).mean() + t["rms_norm_eps"]))
    pre = torch.sigmoid(m[:hc] * scale[0] + base[:hc]) + t["hc_eps"]
    post = 2 * torch.sigmoid(m[hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    c = torch.softmax((m[2 * hc :] * scale[2] + base[2 * hc :]).reshape(hc, hc), dim=1) + t["hc_eps"]
    c = c / (c.sum(0, keepdim=True) + t["hc_eps"])
    for _ in range(t["hc_sinkhorn_iters"] - 1):
        c = c / (c.sum(1, keepdim=True) + t["hc_eps"])
        c = c / (c.sum(0, keepdim=True) + t["hc_eps"])
    return pre, post, c


def _expert(x, w, p, limit, scale=1.0):
    gate, up = (x @ w[f"{p}.w1"]).clamp(max=limit), (x @ w[f"{p}.w3"]).clamp(-limit, limit)
    return (scale * torch.nn.functional.silu(gate) * up) @ w[f"{p}.w2"]


def oneshot(raw, w, toks, rows=None):
    """Logits [n, V] of a whole sequence, recomputing everything from scratch."""
    t = raw["text_config"]
    n, hc, eps = len(toks), t["hc_mult"], t["rms_norm_eps"]
    rd = t["qk_rope_head_dim"]
    ys = t["rope_scaling"]
    inv_main = default_inv_freq(t["rope_theta"], rd).to(F64)
    inv_comp = yarn_inv_freq(
        t["compress_rope_theta"],
        rd,
        ys["factor"],
        ys["original_max_position_embeddings"],
        ys["beta_fast"],
        ys["beta_slow"],
    ).to(F64)
    streams = [w["embed.weight"][tok].repeat(hc, 1) for tok in toks]
    pres = [torch.eye(hc, dtype=F64)[0] for _ in toks]
    published = {}
    for layer in range(t["num_hidden_layers"]):
        b, ratio = f"layers.{layer}", t["compress_ratios"][layer]
        if layer in t["engram_layer_ids"] and rows is not None:
            for k in range(n):
                kv = rows[layer][k].reshape(-1) @ w[f"{b}.engram.wkv"]
                qk = w[f"{b}.engram.q_weight"] * w[f"{b}.engram.k_weight"]
                new = streams[k].clone()
                for i in range(hc):
                    key, h = kv[i * t["hidden_size"] : (i + 1) * t["hidden_size"]], streams[k][i]
                    dot = (
                        (h * qk[i] * key).sum()
                        / torch.sqrt((h * h).mean() + eps)
                        / torch.sqrt((key * key).mean() + eps)
                    )
                    dot = float(dot) / math.sqrt(t["hidden_size"])
                    gate = 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(dot), 1e-6)), dot)))
                    new[i] = h + gate * kv[hc * t["hidden_size"] :]
                streams[k] = new
        mixes = [
            _mix(s, w[f"{b}.hc_attn_fn"], w[f"{b}.hc_attn_scale"], w[f"{b}.hc_attn_base"], t) for s in streams
        ]
        x = torch.stack(
            [_rms((pres[k][:, None] * streams[k]).sum(0), w[f"{b}.attn_norm.weight"], eps) for k in range(n)]
        )
        y = _attention(t, w, layer, ratio, x, inv_main, inv_comp, published)
        streams = [mixes[k][1][:, None] * y[k] + mixes[k][2].T @ streams[k] for k in range(n)]
        fmix = [
            _mix(s, w[f"{b}.hc_ffn_fn"], w[f"{b}.hc_ffn_scale"], w[f"{b}.hc_ffn_base"], t) for s in streams
        ]
        out = []
        for k in range(n):
            xf = _rms((mixes[k][0][:, None] * streams[k]).sum(0), w[f"{b}.ffn_norm.weight"], eps)
            s = torch.sqrt(torch.nn.functional.softplus(w[f"{b}.ffn.gate.weight"] @ xf))
            biased = (s + w[f"{b}.ffn.gate.bias"]).tolist()
            chosen = sorted(range(len(biased)), key=lambda e, bb=biased: -bb[e])[: t["num_experts_per_tok"]]
            total = sum(float(s[e]) for e in chosen)
            yk = _expert(xf, w, f"{b}.ffn.shared_experts", t["swiglu_limit"])
            for e in chosen:
                scale = float(s[e]) / (total + 1e-20) * t["routed_scaling_factor"]
                yk = yk + _expert(xf, w, f"{b}.ffn.experts.{e}", t["swiglu_limit"], scale)
            out.append(fmix[k][1][:, None] * yk + fmix[k][2].T @ streams[k])
        streams, pres = out, [m[0] for m in fmix]
    final = torch.stack(
        [_rms((pres[k][:, None] * streams[k]).sum(0), w["norm.weight"], eps) for k in range(n)]
    )
    return final @ w["head"]


def _attention(t, w, layer, ratio, x, inv_main, inv_comp, published):
    a, eps, n = f"layers.{layer}.attn", t["rms_norm_eps"], x.shape[0]
    heads, hd, sw = t["num_attention_heads"], t["head_dim"], t["sliding_window"]
    inv = inv_comp if ratio else inv_main
    q_res = [_rms(x[k] @ w[f"{a}.wq_a"], w[f"{a}.q_norm.weight"], eps) for k in range(n)]
    q = [_rot((q_res[k] @ w[f"{a}.wq_b"]).reshape(heads, hd), k, inv) for k in range(n)]
    kv = [
        fake_quant_fp8(_rot(_rms(x[k] @ w[f"{a}.wkv"], w[f"{a}.kv_norm.weight"], eps), k, inv), 32)
        for k in range(n)
    ]
    if layer in t["kv_source_layer_ids"]:
        entries, ikeys = [], []
        for grp in range(n // ratio):
            members = range(grp * ratio, grp * ratio + ratio)
            raw = torch.stack([x[m] @ w[f"{a}.compressor.wkv"] for m in members])
            if ratio > 1:
                gate = torch.softmax(torch.stack([x[m] @ w[f"{a}.compressor.wgate"] for m in members]), dim=0)
                raw = (raw * gate).sum(0, keepdim=True)
            latent = _rms(raw[0], w[f"{a}.compressor.norm.weight"], eps)
            entries.append(fake_quant_fp4(_rot(latent, grp * ratio, inv_comp), 16, e4m3_scale=True))
            ik = _rms(latent @ w[f"{a}.indexer.wk"], w[f"{a}.indexer.k_norm.weight"], eps)
            ikeys.append(fake_quant_fp4(_rot(ik, grp * ratio, inv_comp), 32))
        published.update(entries=entries, ikeys=ikeys)
    if layer in t["index_source_layer_ids"]:
        ih, idim = t["index_n_heads"], t["index_head_dim"]
        chosen, cands = [], []
        for k in range(n):
            qi = fake_quant_fp4(_rot((q_res[k] @ w[f"{a}.indexer.wq_b"]).reshape(ih, idim), k, inv), 32)
            wts = w[f"{a}.indexer.weights_proj.weight"] @ x[k] / math.sqrt(ih)
            vis = (k + 1) // ratio
            score = {
                g: float((torch.relu(qi @ published["ikeys"][g]) / math.sqrt(idim) * wts).sum())
                for g in range(vis)
            }
            if layer == t["candidate_source_layer_id"]:
                bs, blocks = t["candidate_block_size"], {}
                for g, v in score.items():
                    blocks[g // bs] = max(blocks.get(g // bs, -math.inf), v)
                if vis:
                    blocks[(vis - 1) // bs] = math.inf
                keep = sorted(blocks, key=lambda bb, bl=blocks: (-bl[bb], bb))[: t["candidate_topk_blocks"]]
                cands.append({g for g in range(len(published["ikeys"])) if g // bs in keep})
            elif layer not in t["kv_source_layer_ids"] and 0 <= t["candidate_source_layer_id"] < layer:
                # only reindex layers use the candidates (spec deepseek_v41.md section 2)
                score = {g: v for g, v in score.items() if g in published["cands"][k]}
            chosen.append(set(sorted(score, key=lambda g, sc=score: (-sc[g], g))[: t["index_topk"]]))
        published["chosen"] = chosen
        if cands:
            published["cands"] = cands
    outs = []
    for k in range(n):
        keys = [kv[j] for j in range(n) if k - sw < j <= k]
        if ratio and published.get("chosen") is not None:
            keys += [published["entries"][g] for g in sorted(published["chosen"][k])]
        keys = torch.stack(keys)
        logits = q[k] @ keys.T / math.sqrt(hd)
        sink = w[f"{a}.attn_sink"][:, None]
        top = torch.maximum(logits.max(1, keepdim=True).values, sink)
        p = torch.exp(logits - top)
        o = (p @ keys) / (p.sum(1, keepdim=True) + torch.exp(sink - top))
        o = _rot(o, k, inv, sign=-1.0)
        per = heads // t["o_groups"]
        parts = [
            o[g * per : (g + 1) * per].reshape(-1) @ w[f"{a}.wo_a.slice.{g}"] for g in range(t["o_groups"])
        ]
        outs.append(torch.cat(parts) @ w[f"{a}.wo_b"])
    return torch.stack(outs)


def _engram_rows(cfg, n, seed):
    g = torch.Generator().manual_seed(seed)
    return {
        layer: torch.randn(n, cfg.engram_cols, cfg.engram_head_dim, generator=g, dtype=F64)
        for layer in cfg.engram_layer_ids
    }


def test_stateful_chunked_forward_matches_one_shot_reference():
    raw = tiny_config_dict()
    cfg = config_from_dict(raw, layer_mode_records(raw))
    w = random_weights(cfg, seed=3, dtype=F64)
    n = 22  # past the window (8), several candidate blocks, more entries than index_topk
    toks = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(4)).tolist()
    rows = _engram_rows(cfg, n, 5)
    ref = oneshot(raw, w, toks, rows)
    model = Dsv41Model(cfg, w, dtype=F64)
    state, got, cuts = model.new_state(), [], [0, 5, 6, 13, 14, 15, n]
    for lo, hi in itertools.pairwise(cuts):
        got.append(model.forward([toks[lo:hi]], [state], [{k: v[lo:hi] for k, v in rows.items()}])[0])
    torch.testing.assert_close(torch.cat(got), ref, rtol=1e-9, atol=1e-9)
    # The reference is sensitive to what it checks: dropping Engram changes the logits.
    plain = Dsv41Model(cfg, w, dtype=F64, engram=False)
    assert not torch.allclose(plain.forward([toks], [plain.new_state()])[0], ref, atol=1e-3)
