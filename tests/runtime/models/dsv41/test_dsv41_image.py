"""Whole-model gates on the tiny pack's own weights, read from its prepared TP=1 image.

fp32 (the default: fp32 activations, every module in fp64) holds to ATOL[fp32] = 2e-6 and fp64 to 1e-9,
as in test_dsv41_model.py (which states why). The CUDA test runs the same image on the GPU and holds its
logits to the CPU's at the same tolerances, greedy tokens equal: both devices sum in fp64 (cuBLAS and
MKL orders differ by ~1e-16) before rounding to fp32. It is marked gpu and skipped without CUDA.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from tfc.runtime.engine.generate import generate
from tfc.runtime.models.dsv41.reference.forward import Dsv41Model
from tfc.runtime.models.dsv41.reference.runner import ReferenceRunner
from tfc.runtime.models.dsv41.reference.weights import engram_feed, load_dense_weights

from tfc.cli import cli

F32, F64 = torch.float32, torch.float64
ATOL = {F32: 2e-6, F64: 1e-9}
DTYPES = pytest.mark.parametrize("dtype", [F32, F64], ids=["fp32", "fp64"])


@pytest.fixture(scope="module")
def tiny(tiny_pack, tmp_path_factory):
    """(config, dense weights, Engram feed) of the tiny pack's prepared TP=1 image."""
    store = tmp_path_factory.mktemp("img")
    result = CliRunner().invoke(
        cli, ["prepare", str(tiny_pack), "-o", str(store), "--engram-dir", str(tiny_pack)]
    )
    assert result.exit_code == 0, result.output
    image = next(p for p in store.iterdir() if p.is_dir() and not p.name.startswith("."))
    cfg, weights = load_dense_weights(image)
    return cfg, weights, engram_feed(weights, cfg.engram_layer_ids, cfg.engram_head_dim)


def _run(model, feed, toks, cuts):
    state, out = model.new_state(), []
    for lo, hi in itertools.pairwise(cuts):
        out.append(model.forward([toks[lo:hi]], [state], [feed.rows(state.tokens, toks[lo:hi])])[0])
    return torch.cat(out)


@pytest.mark.slow
@DTYPES
def test_tiny_image_one_pass_chunks_and_decode_agree(tiny, dtype):
    cfg, weights, feed = tiny
    model = Dsv41Model(cfg, weights, dtype=dtype)
    n = 44  # past the window (32), more entries than index_topk (16), several candidate blocks
    toks = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    whole = _run(model, feed, toks, [0, n])
    cuts = [0, *sorted(np.random.default_rng(2).choice(np.arange(1, n), 5, replace=False).tolist()), n]
    torch.testing.assert_close(_run(model, feed, toks, cuts), whole, rtol=0, atol=ATOL[dtype])
    torch.testing.assert_close(_run(model, feed, toks, list(range(n + 1))), whole, rtol=0, atol=ATOL[dtype])
    assert whole.std() > 0.05


def test_dspark_blocks_are_loadable_but_not_run(tiny):
    cfg, weights, _ = tiny
    mtp = sorted(n for n in weights if n.startswith("mtp."))
    assert {"mtp.0.attn.wq_a", "mtp.0.ffn.experts.0.w1", "mtp.0.ffn.shared_experts.w2"} <= set(mtp)
    assert tuple(weights["mtp.0.ffn.experts.3.w2"].shape) == (cfg.moe_intermediate_size, cfg.hidden_size)
    assert tuple(weights["mtp.0.attn.wq_a"].shape) == (cfg.hidden_size, cfg.q_lora_rank)
    model = Dsv41Model(cfg, weights, dtype=F64, engram=False)
    model.forward([[cfg.bos_token_id, 5]], [model.new_state()])
    assert not any(n.startswith("mtp.") for n in model._held)


@pytest.mark.slow
def test_tiny_image_greedy_64_tokens_do_not_depend_on_prefill_chunks(tiny):
    cfg, weights, feed = tiny
    model = Dsv41Model(cfg, weights)
    prompt = [cfg.bos_token_id, *range(100, 113)]
    runs = [
        generate(ReferenceRunner(model, feed), [prompt], 64, prefill_chunk=c, keep_logits=True)[0]
        for c in (0, 5)
    ]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 64
    torch.testing.assert_close(
        torch.stack(runs[1].logits), torch.stack(runs[0].logits), rtol=0, atol=ATOL[F32]
    )
    assert len(set(runs[0].tokens)) > 8


@pytest.mark.gpu
@DTYPES
def test_tiny_image_on_cuda_matches_cpu(tiny, dtype):
    cfg, weights, feed = tiny
    toks = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(3)).tolist()
    cpu = Dsv41Model(cfg, weights, dtype=dtype)
    gpu = Dsv41Model(cfg, weights, dtype=dtype, device="cuda")
    for cuts in ([0, 40], [0, 17, 18, 40]):
        torch.testing.assert_close(
            _run(gpu, feed, toks, cuts).cpu(), _run(cpu, feed, toks, [0, 40]), rtol=0, atol=ATOL[dtype]
        )
    prompt = [cfg.bos_token_id, *range(100, 113)]
    want = generate(ReferenceRunner(cpu, feed), [prompt], 32)[0].tokens
    assert generate(ReferenceRunner(gpu, feed), [prompt], 32)[0].tokens == want
