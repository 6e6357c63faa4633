"""The fast forward on a GPU: graphs, exactness, row invariance, agreement with the reference (skipped without CUDA).

On the tiny image (prepared here): graph == eager bit for bit (tokens and logits of 64 greedy steps); concurrent ==
solo bit for bit (1 to 16 rows a step, another slot; 1 to 256 rows, the row last, graphed and eager); prefill in any chunking == decode bit for bit; the layers' KV
rows written on a side stream (fast/overlap.py) give the serial steps' bits; the pinned kernel launches give a row
the same bits whatever the other rows hold or how many there are; a slot restored from a snapshot (device, host
copy, bytes: kernels/run_copy.py) continues bit for bit; fast vs reference over 520 teacher-forced random positions:
top-1 >= 99 % and logits within GPU_ATOL = 0.02 (the GEMM kernel rounds its rotated input to fp16: emulating that on
the CPU gave at most 2.0e-3 over three seeds, 6 % of the logits' spread is 0.019). On a Flash-geometry slice (set
TFC_FLASH_IMAGE to a prepared `tfc fixture flash-random --layers 4` image: `tfc fixture flash-random /tmp/fr
--layers 4 -j 16 && tfc prepare /tmp/fr -o /tmp/fr-store`): every layer's streams and the logits of 8 tokens against
the reference forward on the same weights decoded on the device, in relative L2, within 1e-2 or twice the distance
between two valid bf16 orders of the fast forward (dense_check.agreement says why), top-1 equal on >= 6 of 8; and
each kernel call of two layers alone against its decoded weights.
Run: python -m pytest -q -p no:cacheprovider tests/runtime/models/dsv41/test_fast_gpu.py  (about 3-6 minutes)
"""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner
from support.dense_check import AGREE_TOKENS
from support.dsv41_image import prepared_image
from support.fast_steps import decode_alongside

from tfc import settings
from tfc.cli import cli

pytestmark = pytest.mark.gpu

GPU_ATOL = 0.02
FAST = {"slots": 202, "tokens_per_slot": 1024, "context_step": 256, "page_tokens": 64}


@pytest.fixture(scope="module")
def image(tiny_pack, tmp_path_factory):
    return prepared_image(tiny_pack, tmp_path_factory.mktemp("img"))


def _runner(image, graphs: bool, **options):
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast.build import build_fast
    from tfc.runtime.options import RuntimeOptions

    booted = boot(image, device="cuda", options=RuntimeOptions(graphs=graphs))
    return booted, build_fast(booted, **{**FAST, **options})


@pytest.fixture(scope="module")
def graphed(image):
    booted, runner = _runner(image, True)
    yield runner
    booted.close()


@pytest.fixture(scope="module")
def eager(image):
    booted, runner = _runner(image, False)
    yield runner
    booted.close()


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 640, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_graphed_drafts_equal_eager_ones(graphed, eager):
    # the DSpark drafter's blocks replayed from its CUDA graph give an eager drafter's drafts and logits, bit for
    # bit, over rounds that observe more rows (the ring's context growing, then past the window) between drafts
    from tfc.runtime.models.dsv41.dspark.fast import FastDsparkDrafter

    gen = torch.Generator().manual_seed(9)
    width = len(graphed.forward.capture) * graphed.forward.cfg.hidden_size
    pieces = [torch.randn(n, width, generator=gen).cuda() for n in (40, 1, 6, 120, 2)]
    runs = []
    for runner in (graphed, eager):
        drafter = runner.drafter.drafter
        assert isinstance(drafter, FastDsparkDrafter) and runner.graphs.enabled == (runner is graphed)
        state, got = drafter.new_state(), []
        for i, hidden in enumerate(pieces):
            draft = drafter.draft(state, hidden, 17 + 40 * i, 5)
            got.append((draft.tokens, draft.logits.cpu()))
        runs.append(got)
    for (tokens, logits), (want_tokens, want_logits) in zip(*runs, strict=True):
        assert tokens == want_tokens and torch.equal(logits, want_logits)
    assert graphed.drafter.drafter.graph_key(1) in graphed.graphs
    assert graphed.drafter.drafter.graph_key not in eager.graphs


def test_graph_replay_equals_eager_over_64_greedy_steps(graphed, eager):
    from tfc.runtime.engine.generate import generate

    prompt = [0, *range(100, 130)]
    runs = [generate(r, [prompt], 64, keep_logits=True)[0] for r in (eager, graphed)]
    assert runs[0].tokens == runs[1].tokens and len(runs[0].tokens) == 64
    assert torch.equal(torch.stack(runs[0].logits), torch.stack(runs[1].logits))
    stats = graphed.stats()["graphs"]
    assert stats["captures"] >= 2 and stats["replays"] >= 60 and stats["fallbacks"] == 0
    assert eager.stats()["graphs"]["captures"] == 0


def test_concurrent_equals_solo_from_1_to_16_rows_in_any_slot(graphed):
    toks = _tokens(48, 7)
    solo = graphed.logits_of(0, toks, 0)
    graphed.release(0)
    others = {s: _tokens(200, 30 + s) for s in range(1, 16) if s != 9}
    order = list(others)

    def takes(i: int, s: int) -> int:  # the first i % 16 others join step i, a few of them prefilling
        if order.index(s) >= i % 16:
            return 0
        return 1 + (i + s) % 3 if s % 4 == 0 else 1

    assert torch.equal(decode_alongside(graphed, 9, toks, others, takes), solo)


def test_a_row_keeps_its_bits_in_steps_of_1_to_256_rows_graphed_or_eager(graphed, eager):
    from tfc.runtime.models.dsv41.fast.graph_keys import StepKey

    toks = _tokens(12, 21)
    solo = graphed.logits_of(0, toks, 0)
    graphed.release(0)
    others = {s: _tokens(40, 40 + s) for s in range(1, 201)}
    # others in step i: 1, 7, 16, 64 and 200 concurrent sequences and between; odd slots feed two tokens, so
    # 200 others make one 256-row step and one of the rest
    joined = (0, 6, 15, 63, 199, 30, 100, 199, 120, 47, 1, 199)

    def takes(i: int, s: int) -> int:
        return 1 + s % 2 if s <= joined[i] else 0

    runs = [decode_alongside(r, 201, toks, others, takes, last=True) for r in (graphed, eager)]
    assert torch.equal(runs[0], solo) and torch.equal(runs[1], solo)
    held = {key.rows for key in graphed.graphs.keys() if isinstance(key, StepKey)}  # noqa: SIM118 (no dict)
    assert {1, 12, 32, 96, 192, 256} <= held


def test_prefill_in_any_chunking_equals_decode(graphed):
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    toks = _tokens(90, 5)
    whole = graphed.logits_of(3, toks, 0)
    graphed.release(3)
    for size in (1, 5, 16, 37):
        parts = [graphed.logits_of(3, toks[lo : lo + size], lo) for lo in range(0, len(toks), size)]
        assert torch.equal(torch.cat(parts), whole), size
        graphed.release(3)
    engine = graphed.execute(StepPlan((SequenceStep(3, tuple(toks), 0),))).logits[0]
    assert torch.equal(engine, whole[-1])
    graphed.release(3)


def test_overlapped_kv_rows_give_the_serial_steps_bits(image, eager, monkeypatch):
    # fast/overlap.py: each layer's KV rows written on a side stream beside its queries, graphed and eager, give
    # the serial eager steps' tokens and logits bit for bit, and a row among others its solo bits
    from tfc.runtime.engine.generate import generate
    from tfc.runtime.models.dsv41.fast import overlap

    prompt = [0, *range(100, 130)]
    with monkeypatch.context() as serial_only:  # the serial steps, the reference: no step gets a side stream
        serial_only.setattr(overlap, "side_stream", lambda f, x: None)
        eager.forward.side = None  # the module's runner may have overlapped already
        serial = generate(eager, [prompt], 32, keep_logits=True)[0]
        assert eager.forward.side is None, "the serial steps took a side stream"
    booted, runner = _runner(image, True)
    try:
        for r in (runner, eager):
            got = generate(r, [prompt], 32, keep_logits=True)[0]
            assert r.forward.side is not None, "no side stream: the steps did not overlap"
            assert got.tokens == serial.tokens
            assert torch.equal(torch.stack(got.logits), torch.stack(serial.logits))
        assert runner.stats()["graphs"]["captures"] >= 2
        toks = _tokens(24, 11)
        solo = runner.logits_of(0, toks, 0)
        runner.release(0)
        others = {s: _tokens(60, 40 + s) for s in range(1, 8)}
        assert torch.equal(decode_alongside(runner, 9, toks, others, lambda i, s: int(s <= i % 8)), solo)
    finally:
        booted.close()


def test_pinned_kernel_launches_give_a_row_the_same_bits_whatever_its_neighbours(graphed):
    w, ops = graphed.forward.weights, graphed.forward.ops
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in ("layers.0.attn.wq_a", "layers.2.attn.wo_b", "head"):
        lin = w.linear(name)
        x = torch.randn(16, lin.k, device="cuda", generator=gen)
        alone = x.clone()
        alone[1:] = 0
        assert torch.equal(ops.linear(x, lin)[0], ops.linear(alone, lin)[0]), name
    cfg = graphed.forward.cfg
    for layer in (0, 2, 4):
        tables = w.experts(f"layers.{layer}")
        x = torch.randn(16, cfg.hidden_size, device="cuda", generator=gen)
        ids = torch.stack([torch.randperm(8, device="cuda", generator=gen)[:2] for _ in range(16)])
        wts = torch.rand(16, 2, device="cuda", generator=gen) + 0.1
        many = ops.moe(x, ids, wts, tables, cfg.swiglu_limit)
        for rows in (1, 3, 8):
            assert torch.equal(
                ops.moe(x[:rows], ids[:rows], wts[:rows], tables, cfg.swiglu_limit), many[:rows]
            )


def test_a_restored_slot_continues_as_the_original_through_the_run_copy_kernel(graphed):
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    toks, tail = _tokens(300, 11), _tokens(6, 12)  # past the window, several pages, inside a compressor group
    free = graphed.kv.pool.free_pages
    try:
        graphed.execute(StepPlan((SequenceStep(0, tuple(toks), 0),)))
        snap = graphed.snapshot(0)
        want = graphed.logits_of(0, tail, len(toks))
        for slot, entry in ((5, snap), (6, snap.to_host()), (7, graphed.load_snapshot(snap.to_bytes()))):
            graphed.restore(slot, entry)
            assert torch.equal(graphed.logits_of(slot, tail, len(toks)), want), slot
    finally:
        for slot in (0, 5, 6, 7):
            graphed.release(slot)
    assert graphed.kv.pool.free_pages == free


def test_fast_matches_the_reference_teacher_forced(graphed):
    from tfc.runtime.models.dsv41.reference.forward import Dsv41Model
    from tfc.runtime.models.dsv41.reference.weights import engram_feed, load_dense_weights

    cfg, weights = load_dense_weights(graphed.forward.weights.image.path)
    feed = engram_feed(weights, cfg.engram_layer_ids, cfg.engram_head_dim)
    model = Dsv41Model(cfg, weights)
    toks = _tokens(520, 11)
    want = model.forward([toks], [model.new_state()], [feed.rows([], toks)])[0]
    got = graphed.logits_of(5, toks, 0).cpu()
    graphed.release(5)
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.99
    torch.testing.assert_close(got, want, rtol=0, atol=GPU_ATOL)


def test_unpinned_launches_run_and_stay_close(image, graphed):
    booted, loose = _runner(image, True, exact=False)
    try:
        toks = _tokens(40, 3)
        got = loose.logits_of(0, toks, 0)
        want = graphed.logits_of(6, toks, 0)
        graphed.release(6)
        torch.testing.assert_close(got, want, rtol=0, atol=GPU_ATOL)
    finally:
        booted.close()


def test_generate_and_load_report_the_fast_forward_and_its_graphs(image):
    args = [
        "generate",
        str(image),
        "--prompt",
        "Hello there",
        "--max-tokens",
        "12",
        "--device",
        "cuda",
        "--json",
        "--no-draft",  # the graphs of decode steps; drafting's verify steps have keys of their own
    ]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    # stdout alone: a library's warning goes to stderr
    run = json.loads(result.stdout.strip().splitlines()[-1])
    assert run["runner"] == "fast" and run["graphs"]["captures"] >= 1 and run["graphs"]["replays"] >= 10
    assert run["prefill_tok_s"] > 0 and run["decode_tok_s"] > 0
    eager = json.loads(CliRunner().invoke(cli, [*args, "--no-graphs"]).stdout.strip().splitlines()[-1])
    assert eager["token_sha"] == run["token_sha"] and eager["graphs"]["captures"] == 0
    result = CliRunner().invoke(cli, ["load", str(image), "--device", "cuda", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1])["graph_counts"]["captures"] == 1


def test_generate_drafted_equals_serial_on_the_fast_forward(image):
    # the DSpark drafter on the arena, verify windows graphed: the same tokens as serial decoding, greedy and seeded
    base = ["generate", str(image), "--prompt", "Hello there", "--max-tokens", "40", "--ignore-eos", "--device",
            "cuda", "--json"]  # fmt: skip
    for sampling in ([], ["--temperature", "1.0", "--top-p", "0.9", "--seed", "7"]):
        runs = []
        for draft in ("--draft", "--no-draft"):
            result = CliRunner().invoke(cli, [*base, *sampling, draft])
            assert result.exit_code == 0, result.output
            runs.append(json.loads(result.stdout.strip().splitlines()[-1]))
        drafted, serial = runs
        assert drafted["runner"] == "fast" and drafted["drafting"]["on"], drafted["drafting"]
        assert drafted["drafting"]["drafts"] > 0 and drafted["drafting"]["draft_tokens"] > 0
        assert serial["drafting"]["on"] is False
        assert drafted["token_sha"] == serial["token_sha"], (sampling, drafted["drafting"])


def test_a_restart_runs_the_stage_kernels_from_the_store_and_gives_the_same_tokens(image):
    # two processes on one store: both run the small-op stages as their Triton kernels, compiled once into the
    # store's Triton cache (kernel_cache.py); torch compiles nothing; the same tokens
    import subprocess
    import sys

    from tfc.runtime.boot.kernel_cache import store_of

    # `python -X importtime -m tfc generate ...`, every module it imports listed on stderr
    run_tfc = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_module('tfc', run_name='__main__')"
    args = [sys.executable, "-X", "importtime", "-c", run_tfc, "tfc", "generate", str(image), "--prompt", "Hello there",
            "--max-tokens", "12", "--device", "cuda", "--json", "--no-draft"]  # fmt: skip
    runs = []
    for _ in range(2):
        done = subprocess.run(args, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        assert "torch._dynamo" not in done.stderr and "torch._inductor" not in done.stderr
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert runs[0]["token_sha"] == runs[1]["token_sha"]
    assert runs[0]["stage_kernels"] > 0 and runs[1]["stage_kernels"] == runs[0]["stage_kernels"]
    assert list(store_of(image).glob(".kernels/sm_*-triton-*/*")), "Triton's cache is not in the store"
    load = subprocess.run([sys.executable, "-m", "tfc", "load", str(image), "--device", "cuda", "--json"],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert load.returncode == 0, load.stderr[-3000:]
    assert json.loads(load.stdout.strip().splitlines()[-1])["stage_kernels"] > 0


@pytest.mark.skipif(
    settings.get("TFC_FLASH_IMAGE") is None, reason="set TFC_FLASH_IMAGE to a flash-random image"
)
def test_flash_slice_layers_match_the_reference_on_device_decoded_weights():
    from support.dense_check import image_agreement

    res = image_agreement(settings.get("TFC_FLASH_IMAGE"), AGREE_TOKENS)
    assert res["pass"] and res["top1_equal"] >= 0.75, res


@pytest.mark.skipif(
    settings.get("TFC_FLASH_IMAGE") is None, reason="set TFC_FLASH_IMAGE to a flash-random image"
)
def test_flash_slice_kernel_calls_match_the_decoded_weights():
    # localises a Flash-geometry disagreement: each kernel call of layers 0 and 2 (and the head) on random
    # inputs against its device-decoded weights, and that decode against the numpy reference
    from support.dense_check import kernel_errors
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast.build import build_fast

    booted = boot(settings.get("TFC_FLASH_IMAGE"), device="cuda")
    try:
        fast = build_fast(booted, slots=1, tokens_per_slot=4096)
        errs = {f"L{layer} {k}": v for layer in (0, 2) for k, v in kernel_errors(fast, layer).items()}
    finally:
        booted.close()
    bad = {k: v for k, v in errs.items()
           if v > {"gemm": 2e-3, "decode": 1e-5, "moe": 1e-4, "router": 1e-5}[k.split()[1]]}  # fmt: skip
    assert not bad, f"off: {bad}; all: {errs}"
