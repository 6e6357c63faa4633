"""Whole-model gates of the DeepSeek-V4.1 reference forward on the tiny random-weights geometry, in fp32.

The forward keeps fp32 activations but computes every module in fp64 and rounds its result to fp32
(runtime/models/dsv41/reference/numerics.py), so a token's fp32 bits do not depend on the batch or on chunking. The gates:
one pass, random chunks and token-by-token decode give the same logits and the same 64 greedy tokens;
four prompts in one batch give each prompt's solo tokens and logits; the same seed samples the same tokens.

Tolerance: ATOL[fp32] = 2e-6 on logits of unit scale (|logit| <= ~4.5, where an fp32 ulp is 4.8e-7).
The runs are bit-identical in practice (100 of 100 random 76-token sequences through one pass, random
chunks and decode, 40 of them also inside a batch of four with chunked prefill); the budget admits the
one thing that can still differ, a rare fp64 result that rounds to the other fp32 neighbour under
another batch shape (one such flip moves the logits by <= 5e-7, measured over 40 injected flips).
Plain fp32 arithmetic misses it: its summation-order noise alone exceeds 3e-6 on every one of 51
sequences measured, and the FP8/FP4 cache quantisers turn it into whole steps (logits off by up to ~3,
greedy tokens diverging). fp64 models hold to ATOL[fp64] = 1e-9.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from support.dsv41_random import random_engram_table, random_weights, tiny_config_dict
from tfc.fixtures.layer_modes import layer_mode_records
from tfc.runtime.engine.generate import generate
from tfc.runtime.engine.sampling import Sampler, SamplingParams
from tfc.runtime.models.dsv41.config import config_from_dict
from tfc.runtime.models.dsv41.engram_hash import HashTables, hash_ids
from tfc.runtime.models.dsv41.reference.engram import EngramFeed
from tfc.runtime.models.dsv41.reference.forward import Dsv41Model, EngramRowsMissing
from tfc.runtime.models.dsv41.reference.runner import ReferenceRunner

F32, F64 = torch.float32, torch.float64
ATOL = {F32: 2e-6, F64: 1e-9}


@pytest.fixture(scope="module")
def cfg():
    raw = tiny_config_dict()
    return config_from_dict(raw, layer_mode_records(raw))


def _feed(cfg, dtype) -> EngramFeed:
    """The real hasher over small prime tables, gathering from random tables."""
    heads, cols = cfg.engram_n_heads, cfg.engram_cols
    primes = np.array([[101, 103, 107, 109], [113, 127, 131, 137]], np.int64)[:, :cols]
    offsets = np.concatenate([np.zeros((2, 1), np.int64), np.cumsum(primes, 1)[:, :-1]], 1)
    rng = np.random.default_rng(0)
    tables = HashTables(
        token_map=np.arange(cfg.vocab_size, dtype=np.int64) % 200,
        multipliers=rng.integers(1, 1 << 40, (2, cfg.engram_max_ngram_size), dtype=np.int64) * 2 + 1,
        primes=primes,
        offsets=offsets,
        pad_id=2,
        n_heads=heads,
    )
    rows = [random_engram_table(cfg, int(primes[k].sum()), seed=10 + k, dtype=dtype) for k in range(2)]
    return EngramFeed(
        cfg.engram_layer_ids,
        cfg.engram_max_ngram_size,
        lambda ids, back: hash_ids(tables, ids, back),
        lambda k, ids: rows[k][ids],
    )


def _run(model, feed, toks, cuts):
    """Logits of `toks` fed in pieces split at `cuts`."""
    state, out = model.new_state(), []
    for lo, hi in itertools.pairwise(cuts):
        rows = [feed.rows(state.tokens, toks[lo:hi])]
        out.append(model.forward([toks[lo:hi]], [state], rows)[0])
    return torch.cat(out)


def _random_cuts(n, seed):
    rng = np.random.default_rng(seed)
    inner = sorted(rng.choice(np.arange(1, n), size=6, replace=False).tolist())
    return [0, *inner, n]


def _close(got, want, dtype):
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL[dtype])


# Seeds on which plain fp32 arithmetic breaks each gate (decode logits off by 2.7 and a different argmax;
# 64-step logits off by 0.76; batch vs solo off by 0.27; batch vs solo sampling a different token).
SEED_PASS, SEED_GREEDY, SEED_BATCH, SEED_SAMPLE = 17, 31, 6, 5


@pytest.mark.parametrize("dtype", [F32, F64], ids=["fp32", "fp64"])
def test_one_pass_chunks_and_decode_agree(cfg, dtype):
    w = random_weights(cfg, seed=SEED_PASS, dtype=dtype)
    model, feed = Dsv41Model(cfg, w, dtype=dtype), _feed(cfg, dtype)
    n, g = 76, torch.Generator().manual_seed(SEED_PASS + 1)
    toks = torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist()
    whole = _run(model, feed, toks, [0, n])
    chunks = _run(model, feed, toks, _random_cuts(n, SEED_PASS + 2))
    decode = _run(model, feed, toks, list(range(n + 1)))
    assert whole.dtype == dtype
    for other in (chunks, decode):
        _close(other, whole, dtype)
        assert torch.equal(other.argmax(-1), whole.argmax(-1))
    assert whole.std() > 0.5  # logits of unit scale: the tolerance is meaningful


@pytest.mark.slow
def test_prefill_modes_give_same_greedy_64_tokens_and_logits(cfg):
    w = random_weights(cfg, seed=SEED_GREEDY)
    model, feed = Dsv41Model(cfg, w), _feed(cfg, F32)
    g = torch.Generator().manual_seed(SEED_GREEDY + 1)
    prompt = torch.randint(0, cfg.vocab_size, (12,), generator=g).tolist()
    runs = [
        generate(ReferenceRunner(model, feed), [prompt], 64, prefill_chunk=c, keep_logits=True)[0]
        for c in (0, 5, 1)
    ]
    for other in runs[1:]:
        assert other.tokens == runs[0].tokens
        _close(torch.stack(other.logits), torch.stack(runs[0].logits), F32)
    assert len(set(runs[0].tokens)) > 8  # not a degenerate repetition
    # The whole sequence in one pass gives the logits the decode steps saw.
    seq = prompt + runs[0].tokens[:-1]
    whole = _run(model, feed, seq, [0, len(seq)])[len(prompt) - 1 :]
    _close(whole, torch.stack(runs[0].logits), F32)


@pytest.mark.slow
def test_four_prompts_in_one_batch_equal_each_prompt_solo(cfg):
    w = random_weights(cfg, seed=SEED_BATCH)
    model, feed = Dsv41Model(cfg, w), _feed(cfg, F32)
    g = torch.Generator().manual_seed(SEED_BATCH + 1)
    prompts = [torch.randint(0, cfg.vocab_size, (n,), generator=g).tolist() for n in (3, 11, 7, 16)]
    batch = generate(ReferenceRunner(model, feed), prompts, 32, keep_logits=True)
    for prompt, got in zip(prompts, batch, strict=True):
        solo = generate(ReferenceRunner(model, feed), [prompt], 32, keep_logits=True)[0]
        assert got.tokens == solo.tokens
        _close(torch.stack(got.logits), torch.stack(solo.logits), F32)
    assert len({tuple(b.tokens) for b in batch}) == 4


@pytest.mark.slow
def test_same_seed_same_sampled_tokens(cfg):
    w = random_weights(cfg, seed=SEED_SAMPLE)
    model, feed = Dsv41Model(cfg, w), _feed(cfg, F32)
    prompts = [[5, 9, 200, 17], [33, 1, 2]]
    p = SamplingParams(temperature=1.3, top_p=0.95, top_k=50, seed=1234)
    first = [x.tokens for x in generate(ReferenceRunner(model, feed), prompts, 24, p)]
    again = [x.tokens for x in generate(ReferenceRunner(model, feed), prompts, 24, p)]
    solo = [generate(ReferenceRunner(model, feed), [prompt], 24, p)[0].tokens for prompt in prompts]
    other = [
        x.tokens
        for x in generate(ReferenceRunner(model, feed), prompts, 24, SamplingParams(1.3, 0.95, 50, seed=99))
    ]
    assert first == again
    assert first == solo  # a sequence's draws do not depend on its batch
    assert other != first
    greedy = generate(ReferenceRunner(model, feed), prompts, 24)
    assert [x.tokens for x in greedy] != first  # sampling is not greedy at temperature 1.3


def test_stop_token_ends_a_sequence_early(cfg):
    model = Dsv41Model(cfg, random_weights(cfg, seed=9), engram=False)
    full = generate(ReferenceRunner(model), [[7, 8, 9]], 10)[0]
    stop = full.tokens[3]
    cut = generate(ReferenceRunner(model), [[7, 8, 9]], 10, stop_ids=[stop])[0]
    assert cut.finish == "stop" and cut.tokens == full.tokens[: full.tokens.index(stop) + 1]


def test_engram_layers_need_rows_unless_disabled(cfg):
    w = random_weights(cfg, seed=10)
    with pytest.raises(EngramRowsMissing, match="layer 1"):
        Dsv41Model(cfg, w).forward([[1, 2, 3]], [Dsv41Model(cfg, w).new_state()])
    plain = Dsv41Model(cfg, w, engram=False)
    assert plain.forward([[1, 2, 3]], [plain.new_state()])[0].shape == (3, cfg.vocab_size)


def test_sampler_greedy_top_k_and_top_p():
    logits = torch.tensor([0.1, 3.0, 2.9, -1.0, 2.95])
    assert Sampler(SamplingParams()).sample(logits) == 1
    hot = Sampler(SamplingParams(temperature=5.0, top_k=2, seed=0))
    assert {hot.sample(logits) for _ in range(200)} == {1, 4}
    narrow = Sampler(SamplingParams(temperature=1.0, top_p=0.3, seed=0))
    assert {narrow.sample(logits) for _ in range(50)} == {1}
    wide = Sampler(SamplingParams(temperature=1.0, seed=0))
    assert len({wide.sample(logits) for _ in range(300)}) >= 4
