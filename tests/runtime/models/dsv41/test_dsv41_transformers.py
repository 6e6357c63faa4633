"""Modules DeepSeek-V4 shares with V4.1, fed the same weights in transformers' deepseek_v4 and in tfc.

transformers 5.23 ships deepseek_v4 (not deepseek_v41). Shared maths: RMSNorm, the mHC site mix
(pre/post/comb; V4 collapses with its own pre), the two rope tables with YaRN and interleaved rotation,
the grouped wo_a, the sqrt-softplus noaux_tc MoE with clamped SwiGLU and shared expert, sink attention.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers", minversion="5.0")
v4 = pytest.importorskip("transformers.models.deepseek_v4.modeling_deepseek_v4")

from support.dsv41_random import random_weights, tiny_config_dict  # noqa: E402
from tfc.fixtures.layer_modes import layer_mode_records  # noqa: E402
from tfc.runtime.models.dsv41.config import config_from_dict  # noqa: E402
from tfc.runtime.models.dsv41.reference.csa import rms_norm  # noqa: E402
from tfc.runtime.models.dsv41.reference.mhc import hc_collapse, hc_mix  # noqa: E402
from tfc.runtime.models.dsv41.reference.moe import moe  # noqa: E402
from tfc.runtime.models.dsv41.reference.rope import apply_rope, build_rope  # noqa: E402
from transformers import DeepseekV4Config  # noqa: E402

F64 = torch.float64
F32 = torch.float32
TOL = {"rtol": 1e-5, "atol": 1e-5}  # the port computes norms and mHC in fp32


@pytest.fixture(scope="module")
def setup():
    raw = tiny_config_dict()
    cfg = config_from_dict(raw, layer_mode_records(raw))
    t = raw["text_config"]
    hf = DeepseekV4Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        moe_intermediate_size=cfg.moe_intermediate_size,
        num_hidden_layers=2,
        num_attention_heads=cfg.num_attention_heads,
        head_dim=cfg.head_dim,
        q_lora_rank=cfg.q_lora_rank,
        partial_rotary_factor=cfg.qk_rope_head_dim / cfg.head_dim,
        num_experts_per_tok=cfg.num_experts_per_tok,
        n_routed_experts=cfg.n_routed_experts,
        routed_scaling_factor=cfg.routed_scaling_factor,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_theta=cfg.rope_theta,
        compress_rope_theta=cfg.compress_rope_theta,
        rope_parameters=dict(t["rope_scaling"]),
        mlp_layer_types=["moe", "moe"],
        rms_norm_eps=cfg.rms_norm_eps,
        o_groups=cfg.o_groups,
        o_lora_rank=cfg.o_lora_rank,
        swiglu_limit=1.0,  # small enough that random activations hit the clamp
    )
    return cfg, hf, random_weights(cfg, seed=11, dtype=F64)


def test_rmsnorm_and_mhc_site_match_v4(setup):
    cfg, hf, w = setup
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, cfg.hidden_size, generator=g)
    norm = v4.DeepseekV4RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
    norm.weight.data = w["layers.2.attn_norm.weight"].float()
    torch.testing.assert_close(rms_norm(x, norm.weight.data, cfg.rms_norm_eps), norm(x), **TOL)

    site = v4.DeepseekV4HyperConnection(hf)
    site.fn.data, site.base.data, site.scale.data = (
        w[f"layers.2.hc_attn_{k}"].float() for k in ("fn", "base", "scale")
    )
    streams = torch.randn(2, 5, cfg.hc_mult, cfg.hidden_size, generator=g)
    post_ref, comb_ref, collapsed_ref = site(streams)
    pre, post, comb = hc_mix(
        streams,
        site.fn.data,
        site.scale.data,
        site.base.data,
        norm_eps=cfg.rms_norm_eps,
        hc_eps=cfg.hc_eps,
        iters=cfg.hc_sinkhorn_iters,
    )
    torch.testing.assert_close(post, post_ref, **TOL)
    torch.testing.assert_close(comb, comb_ref, **TOL)
    torch.testing.assert_close(hc_collapse(streams, pre), collapsed_ref, **TOL)


@pytest.mark.parametrize("kind", ["main", "compress"])
def test_rope_tables_and_rotation_match_v4(setup, kind):
    cfg, hf, _ = setup
    rotary = v4.DeepseekV4RotaryEmbedding(hf)
    positions = torch.tensor([[0, 1, 7, 63, 64, 200, 255]])
    x = torch.randn(1, 3, positions.shape[1], cfg.head_dim, generator=torch.Generator().manual_seed(2))
    cos_ref, sin_ref = rotary(x, positions, layer_type=kind)
    cos, sin = build_rope(cfg).cos_sin(positions, kind, torch.float32)
    torch.testing.assert_close(cos, cos_ref, rtol=0, atol=2e-6)
    torch.testing.assert_close(sin, sin_ref, rtol=0, atol=2e-6)
    ref = v4.apply_rotary_pos_emb(x, cos_ref, sin_ref)  # [B, H, S, D] with cos [B, S, r/2]
    got = apply_rope(x, cos_ref.unsqueeze(1), sin_ref.unsqueeze(1))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    if kind == "compress":  # YaRN moved some frequencies: the two tables differ
        assert not torch.allclose(build_rope(cfg).main, build_rope(cfg).compress)


def test_grouped_output_projection_matches_v4(setup):
    cfg, _, w = setup
    per = cfg.num_attention_heads // cfg.o_groups * cfg.head_dim
    lin = v4.DeepseekV4GroupedLinear(per, cfg.o_groups * cfg.o_lora_rank, cfg.o_groups).double()
    slices = [w[f"layers.0.attn.wo_a.slice.{g}"] for g in range(cfg.o_groups)]
    lin.weight.data = torch.cat([s.T for s in slices])
    o = torch.randn(
        2, 3, cfg.num_attention_heads, cfg.head_dim, generator=torch.Generator().manual_seed(3), dtype=F64
    )
    ref = lin(o.reshape(2, 3, cfg.o_groups, per)).flatten(2)
    heads = cfg.num_attention_heads // cfg.o_groups
    got = torch.cat(
        [o[:, :, g * heads : (g + 1) * heads].flatten(2) @ slices[g] for g in range(cfg.o_groups)], -1
    )
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)


def test_moe_block_matches_v4(setup):
    cfg, hf, w = setup
    block = v4.DeepseekV4SparseMoeBlock(hf, 1).double().eval()
    f = "layers.3.ffn"
    block.gate.weight.data = w[f"{f}.gate.weight"].clone()
    block.gate.e_score_correction_bias.data = w[f"{f}.gate.bias"].clone()
    for e in range(cfg.n_routed_experts):
        p = f"{f}.experts.{e}"
        block.experts.gate_up_proj.data[e] = torch.cat([w[f"{p}.w1"].T, w[f"{p}.w3"].T])
        block.experts.down_proj.data[e] = w[f"{p}.w2"].T
    sh = block.shared_experts
    sh.gate_proj.weight.data, sh.up_proj.weight.data, sh.down_proj.weight.data = (
        w[f"{f}.shared_experts.{k}"].T.clone() for k in ("w1", "w3", "w2")
    )
    x = torch.randn(2, 6, cfg.hidden_size, generator=torch.Generator().manual_seed(4), dtype=F64) * 3
    with torch.no_grad():
        ref = block(x)
    got = moe(
        x.reshape(-1, cfg.hidden_size),
        w.__getitem__,
        f,
        cfg.n_routed_experts,
        cfg.num_experts_per_tok,
        cfg.routed_scaling_factor,
        1.0,
    ).reshape(x.shape)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-10)


def test_sink_attention_matches_v4_eager(setup):
    from tfc.runtime.models.dsv41.reference.attention import attend

    cfg, _, w = setup
    g = torch.Generator().manual_seed(5)
    heads, dim, s, window = cfg.num_attention_heads, cfg.head_dim, 6, 4
    q = torch.randn(1, heads, s, dim, generator=g, dtype=F64)
    kv = torch.randn(1, 1, s, dim, generator=g, dtype=F64)
    module = torch.nn.Module()
    module.sinks = torch.nn.Parameter(w["layers.0.attn.attn_sink"].clone())
    module.num_key_value_groups = heads
    pos = torch.arange(s)
    allowed = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
    mask = torch.zeros(1, 1, s, s, dtype=F64).masked_fill(~allowed, float("-inf"))
    ref, _ = v4.eager_attention_forward(module, q, kv, kv, mask, scaling=dim**-0.5)
    got = attend(q[0].transpose(0, 1), kv[0, 0], pos, pos, window, module.sinks.data)
    torch.testing.assert_close(got, ref[0], rtol=1e-12, atol=1e-12)
