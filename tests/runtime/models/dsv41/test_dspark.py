"""The DSpark drafter on the tiny image's own weights: its draft, its state, and an independent re-derivation.

`draft_oneshot` recomputes a draft from scratch in plain float64 loops, straight from the maths in
docs/drafting.md (no ring, no state: the context keys are rebuilt from every observed hidden row). Only the
FP8 quantiser and the rope frequency table are shared with tfc, as in test_dsv41_reference.py. Tolerances:
float64 runs agree to 1e-9; float32 runs to 2e-6 (runtime/models/dsv41/reference/numerics.py says why).
"""

from __future__ import annotations

import math

import pytest
import torch
from tfc.runtime.models.dsv41.dspark.drafter import DraftError, DsparkDrafter
from tfc.runtime.models.dsv41.reference.forward import Dsv41Model
from tfc.runtime.models.dsv41.reference.quant import fake_quant_fp8
from tfc.runtime.models.dsv41.reference.rope import default_inv_freq
from tfc.runtime.models.dsv41.reference.weights import load_dense_weights

F32, F64 = torch.float32, torch.float64
ATOL = {F32: 2e-6, F64: 1e-9}
N = 40  # prompt rows: past the tiny window (32), so the drafter's rings wrap


@pytest.fixture(scope="module")
def tiny(tiny_image):
    """(config, weights) of the tiny pack's TP=1 image (no Engram tables: the models run engram=False)."""
    return load_dense_weights(tiny_image)


@pytest.fixture(scope="module")
def runs(tiny):
    """Per dtype: (model, prompt, its logits, its captured target hidden) of one whole forward."""
    cfg, weights = tiny
    prompt = torch.randint(0, cfg.vocab_size, (N,), generator=torch.Generator().manual_seed(7)).tolist()
    out = {}
    for dtype in (F32, F64):
        model = Dsv41Model(cfg, weights, dtype=dtype, engram=False)
        logits, hidden = model.forward([prompt], [model.new_state()], capture=cfg.dspark_target_layer_ids)
        out[dtype] = (model, prompt, logits[0], hidden[0])
    return out


def _assert_same_draft(a, b, dtype):
    assert a.tokens == b.tokens
    for x, y in ((a.logits, b.logits), (a.base, b.base), (a.confidence, b.confidence)):
        torch.testing.assert_close(x, y, rtol=0, atol=ATOL[dtype])


def test_draft_is_k_vocabulary_tokens_and_deterministic(runs):
    model, _, logits, hidden = runs[F32]
    cfg, drafter = model.config, DsparkDrafter(model)
    anchor = int(logits[-1].argmax())
    state = drafter.new_state()
    full = drafter.draft(state, hidden, anchor)
    assert len(full.tokens) == cfg.dspark_block_size == 5
    assert all(0 <= t < cfg.vocab_size for t in full.tokens)
    assert full.logits.shape == (5, cfg.vocab_size) and full.base.shape == (5, cfg.vocab_size)
    assert full.confidence is not None and full.confidence.shape == (5,)
    assert state.position == N  # drafting reads the state; only the observed rows moved it
    # Again from the same state (nothing new observed), and from a fresh one: the same draft.
    _assert_same_draft(drafter.draft(state, hidden[:0], anchor), full, F32)
    _assert_same_draft(DsparkDrafter(model).draft(drafter.new_state(), hidden, anchor), full, F32)
    # k < block size: the Markov chain is sequential, so a shorter draft is the longer one's prefix.
    short = drafter.draft(state, hidden[:0], anchor, k=2)
    assert short.tokens == full.tokens[:2]
    torch.testing.assert_close(short.logits, full.logits[:2], rtol=0, atol=0)
    # The draft reads the context: another anchor or another prompt changes it.
    assert drafter.draft(state, hidden[:0], (anchor + 1) % cfg.vocab_size).logits[0].ne(full.logits[0]).any()
    other = drafter.draft(drafter.new_state(), hidden[: N // 2], anchor)
    assert (other.base - full.base).abs().max() > 1e-4


def test_a_sampler_sees_each_draft_row_with_its_markov_bias(runs):
    model, _, logits, hidden = runs[F32]
    drafter = DsparkDrafter(model)
    anchor, seen = int(logits[-1].argmax()), []

    def second_best(row):
        seen.append(row.clone())
        return int(row.topk(2).indices[1])

    draft = drafter.draft(drafter.new_state(), hidden, anchor, choose=second_best)
    torch.testing.assert_close(torch.stack(seen), draft.logits, rtol=0, atol=0)
    prev = [anchor, *draft.tokens[:-1]]
    for i, token in enumerate(prev):
        bias = drafter.markov_bias(token)
        torch.testing.assert_close(draft.logits[i], draft.base[i] + bias, rtol=0, atol=ATOL[F32])


@pytest.mark.parametrize("dtype", [F32, F64], ids=["fp32", "fp64"])
def test_state_is_exact_in_pieces_and_after_a_clone(runs, dtype):
    model, _, logits, hidden = runs[dtype]
    drafter, anchor = DsparkDrafter(model), int(logits[-1].argmax())
    whole = drafter.draft(drafter.new_state(), hidden, anchor)
    state = drafter.new_state()
    for lo, hi in ((0, 1), (1, 9), (9, 30), (30, 31), (31, N)):
        drafter.observe(state, hidden[lo:hi])
    _assert_same_draft(drafter.draft(state, hidden[:0], anchor), whole, dtype)
    # A clone is a rollback point: advancing the original leaves it as it was.
    early = drafter.new_state()
    drafter.observe(early, hidden[:25])
    saved = early.clone()
    want = drafter.draft(saved.clone(), hidden[:0], anchor)
    got = drafter.draft(early, hidden[25:], anchor)
    _assert_same_draft(got, whole, dtype)
    assert saved.position == 25
    _assert_same_draft(drafter.draft(saved, hidden[:0], anchor), want, dtype)
    _assert_same_draft(drafter.draft(saved, hidden[25:], anchor), whole, dtype)


def test_draft_rounds_match_an_independent_float64_derivation(runs, tiny):
    model, prompt, logits, hidden = runs[F64]
    _, weights = tiny
    cfg, drafter = model.config, DsparkDrafter(model)
    w = _Weights(weights)
    state, rows = drafter.new_state(), hidden
    anchor = int(logits[-1].argmax())
    target_state = model.new_state()
    model.forward([prompt], [target_state])
    for _ in range(2):  # after the prompt, then after the target commits the anchor and two drafts
        got = drafter.draft(state, rows if state.position == 0 else rows[-3:], anchor)
        want = draft_oneshot(cfg, w, rows, anchor)
        assert got.tokens == want["tokens"]
        for key in ("logits", "base", "confidence"):
            torch.testing.assert_close(getattr(got, key), want[key], rtol=0, atol=ATOL[F64])
        step_logits, step_hidden = model.forward(
            [[anchor, *got.tokens[:2]]], [target_state], capture=cfg.dspark_target_layer_ids
        )
        rows, anchor = torch.cat((rows, step_hidden[0])), int(step_logits[0][-1].argmax())
    assert state.position == N + 3


def test_capture_changes_no_logits_and_taps_the_block_inputs(runs, tiny):
    model, prompt, logits, hidden = runs[F32]
    cfg = model.config
    assert torch.equal(model.forward([prompt], [model.new_state()])[0], logits)
    # Layer 0's input streams are the embedding on every stream: their mean is the embedding row.
    first = model.forward([prompt[:5]], [model.new_state()], capture=(0,))[1][0]
    assert torch.equal(first, model.get("embed.weight")[prompt[:5]])
    # Chunked, batched with another sequence, and last-only captures give the same rows.
    state, pieces = model.new_state(), []
    for lo, hi in ((0, 17), (17, N)):
        out = model.forward(
            [prompt[lo:hi], prompt[:3]],
            [state, model.new_state()],
            capture=cfg.dspark_target_layer_ids,
        )
        pieces.append(out[1][0])
    torch.testing.assert_close(torch.cat(pieces), hidden, rtol=0, atol=ATOL[F32])
    last = model.forward([prompt], [model.new_state()], last_only=True, capture=cfg.dspark_target_layer_ids)
    torch.testing.assert_close(last[1][0], hidden[-1:], rtol=0, atol=0)
    assert hidden.shape == (N, 3 * cfg.hidden_size)


def test_bad_requests_are_refused(runs):
    model, _, _, hidden = runs[F32]
    drafter = DsparkDrafter(model)
    with pytest.raises(DraftError, match="1 to 5"):
        drafter.draft(drafter.new_state(), hidden, 3, k=6)
    with pytest.raises(DraftError, match="target hidden"):
        drafter.observe(drafter.new_state(), hidden[:, :10])
    with pytest.raises(DraftError, match="nothing observed"):
        drafter.draft(drafter.new_state(), hidden[:0], 3)


# -- the independent derivation --------------------------------------------------------------------------


class _Weights:
    """Float64 copies of the image's dense weights by name; DSpark-wide tensors from the latest mtp.i."""

    def __init__(self, weights):
        self._w, self._held = weights, {}

    def __getitem__(self, name):
        if name not in self._held:
            self._held[name] = torch.as_tensor(self._w[name]).to(F64)
        return self._held[name]

    def latest(self, suffix, blocks):
        return self[
            next(f"mtp.{j}.{suffix}" for j in reversed(range(blocks)) if f"mtp.{j}.{suffix}" in self._w)
        ]


def _rms(v, weight, eps):
    return weight * v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)


def _rot(v, pos, inv, sign=1.0):
    r = 2 * len(inv)
    c, s = torch.cos(sign * pos * inv), torch.sin(sign * pos * inv)
    pairs = v[..., v.shape[-1] - r :].reshape(*v.shape[:-1], r // 2, 2)
    e, o = pairs[..., 0], pairs[..., 1]
    turned = torch.stack((e * c - o * s, e * s + o * c), dim=-1).reshape(*v.shape[:-1], r)
    return torch.cat((v[..., : v.shape[-1] - r], turned), dim=-1)


def _mix(s, fn, scale, base, cfg):
    hc, flat = s.shape[0], s.reshape(-1)
    m = fn @ (flat / torch.sqrt((flat * flat).mean() + cfg.rms_norm_eps))
    pre = torch.sigmoid(m[:hc] * scale[0] + base[:hc]) + cfg.hc_eps
    post = cfg.hc_post_alpha * torch.sigmoid(m[hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    c = torch.softmax((m[2 * hc :] * scale[2] + base[2 * hc :]).reshape(hc, hc), dim=1) + cfg.hc_eps
    c = c / (c.sum(0, keepdim=True) + cfg.hc_eps)
    for _ in range(cfg.hc_sinkhorn_iters - 1):
        c = c / (c.sum(1, keepdim=True) + cfg.hc_eps)
        c = c / (c.sum(0, keepdim=True) + cfg.hc_eps)
    return pre, post, c


def _expert(x, w, p, limit, scale=1.0):
    gate, up = (x @ w[f"{p}.w1"]).clamp(max=limit), (x @ w[f"{p}.w3"]).clamp(-limit, limit)
    return (scale * torch.nn.functional.silu(gate) * up) @ w[f"{p}.w2"]


def _moe(x, w, f, cfg):
    s = torch.sqrt(torch.nn.functional.softplus(w[f"{f}.gate.weight"] @ x))
    biased = (s + w[f"{f}.gate.bias"]).tolist()
    chosen = sorted(range(len(biased)), key=lambda e: (-biased[e], e))[: cfg.dspark_num_experts_per_tok]
    total = sum(float(s[e]) for e in chosen)
    y = _expert(x, w, f"{f}.shared_experts", cfg.swiglu_limit)
    for e in chosen:
        scale = float(s[e]) / (total + 1e-20) * cfg.routed_scaling_factor
        y = y + _expert(x, w, f"{f}.experts.{e}", cfg.swiglu_limit, scale)
    return y


def _kv(x, w, a, pos, inv, eps):
    return fake_quant_fp8(_rot(_rms(x @ w[f"{a}.wkv"], w[f"{a}.kv_norm.weight"], eps), pos, inv), 32)


def draft_oneshot(cfg, w, hidden, anchor):
    """tokens, logits [B, V], base [B, V], confidence [B] of the block after the observed rows `hidden`."""
    nb, bsz, eps, hc = cfg.num_nextn_predict_layers, cfg.dspark_block_size, cfg.rms_norm_eps, cfg.hc_mult
    heads, hd, per = cfg.num_attention_heads, cfg.head_dim, cfg.num_attention_heads // cfg.o_groups
    inv = default_inv_freq(cfg.rope_theta, cfg.qk_rope_head_dim).to(F64)
    start = hidden.shape[0]  # the block's first position
    seen = range(max(0, start - cfg.sliding_window), start)
    main_x = {
        p: _rms(hidden[p].to(F64) @ w.latest("main_proj", nb), w.latest("main_norm.weight", nb), eps)
        for p in seen
    }
    ids = [anchor] + [cfg.dspark_noise_token_id] * (bsz - 1)
    streams = [w["embed.weight"][t].repeat(hc, 1) for t in ids]
    pres = [torch.eye(hc, dtype=F64)[0] for _ in ids]
    for j in range(nb):
        b = f"mtp.{j}"
        a = f"{b}.attn"
        mixes = [
            _mix(s, w[f"{b}.hc_attn_fn"], w[f"{b}.hc_attn_scale"], w[f"{b}.hc_attn_base"], cfg)
            for s in streams
        ]
        x = [
            _rms((pres[i][:, None] * streams[i]).sum(0), w[f"{b}.attn_norm.weight"], eps) for i in range(bsz)
        ]
        keys = [_kv(main_x[p], w, a, p, inv, eps) for p in seen]
        keys += [_kv(x[i], w, a, start + i, inv, eps) for i in range(bsz)]  # every row sees every block key
        keys = torch.stack(keys)
        ys = []
        for i in range(bsz):
            q_res = _rms(x[i] @ w[f"{a}.wq_a"], w[f"{a}.q_norm.weight"], eps)
            q = _rot((q_res @ w[f"{a}.wq_b"]).reshape(heads, hd), start + i, inv)
            att = q @ keys.T / math.sqrt(hd)
            sink = w[f"{a}.attn_sink"][:, None]
            probs = torch.softmax(torch.cat((att, sink), dim=1), dim=1)[:, :-1]
            o = _rot(probs @ keys, start + i, inv, sign=-1.0)
            parts = [
                o[g * per : (g + 1) * per].reshape(-1) @ w[f"{a}.wo_a.slice.{g}"] for g in range(cfg.o_groups)
            ]
            ys.append(torch.cat(parts) @ w[f"{a}.wo_b"])
        streams = [mixes[i][1][:, None] * ys[i] + mixes[i][2].T @ streams[i] for i in range(bsz)]
        fmix = [
            _mix(s, w[f"{b}.hc_ffn_fn"], w[f"{b}.hc_ffn_scale"], w[f"{b}.hc_ffn_base"], cfg) for s in streams
        ]
        out = []
        for i in range(bsz):
            xf = _rms((mixes[i][0][:, None] * streams[i]).sum(0), w[f"{b}.ffn_norm.weight"], eps)
            out.append(fmix[i][1][:, None] * _moe(xf, w, f"{b}.ffn", cfg) + fmix[i][2].T @ streams[i])
        streams, pres = out, [m[0] for m in fmix]
    x = torch.stack([(pres[i][:, None] * streams[i]).sum(0) for i in range(bsz)])
    base = _rms(x, w.latest("norm.weight", nb), eps) @ w["head"]
    embed, head = w.latest("markov_head.embed.weight", nb), w.latest("markov_head.head.weight", nb)
    proj = w.latest("confidence_head.proj.weight", nb).reshape(-1)
    tokens, logits, conf = [anchor], [], []
    for i in range(bsz):
        prev = embed[tokens[-1]]
        logits.append(base[i] + head @ prev)
        conf.append(torch.cat((x[i], prev)) @ proj)
        tokens.append(int(torch.argmax(logits[-1])))
    return {
        "tokens": tuple(tokens[1:]),
        "logits": torch.stack(logits),
        "base": base,
        "confidence": torch.stack(conf),
    }
