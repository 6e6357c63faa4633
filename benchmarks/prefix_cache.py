"""Prefix cache: TTFT of a long conversation's next turn, cached against uncached, and a host-tier restore's rate.

    python benchmarks/prefix_cache.py --out benchmarks/results/serve/prefix_cache_cpu.json
    python3 benchmarks/prefix_cache.py --image IMG/rank0 --device cuda --tokens 16000 --out $OUT/prefix.json

Part `ttft` (through `tfc serve` and the official openai client, token-id prompts so turn 2 extends turn 1's
ids exactly): two servers side by side, `--no-prefix-cache` and the cache's device tier. Each rep sends turn 1
(`--tokens` ids, a rep-unique start) to the caching server, then turn 2 (turn 1's ids and 64 new ones: the
next message of the conversation) to both, streamed, max_tokens 1: TTFT = request sent -> first chunk. Both servers must return the same token
(resumed == fresh). Part `restore` (in process, one Worker): a slot fed `--tokens` ids, its snapshot's host
copy restored into another slot, timed (median), against the host-to-device copy of as many bytes from pinned
memory (CUDA; on the CPU a host memcpy of them, which says little). The tiny image's context is 4,096 tokens.
`--flash-kv` adds the same restore at the whole Flash model's KV geometry (40 layers: random KV bytes, no weights),
where the bytes a token holds are ten times the 4-layer slice's and the host's work is the same.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_cpu import ENV, build_image  # noqa: E402
from support.server import ServerProcess  # noqa: E402

NEW = 64


def ids(n: int, seed: int, vocab: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(n)]


def first_token(client, prompt: list[int]) -> dict:
    sent = time.perf_counter()
    first, sha, cached = None, None, None
    for chunk in client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0, stream=True,
                                           stream_options={"include_usage": True}, extra_body={"ignore_eos": True}):  # fmt: skip
        if first is None and chunk.choices:
            first = time.perf_counter()
        if chunk.choices and chunk.choices[0].finish_reason:
            sha = getattr(chunk.choices[0], "token_sha", None)
        if chunk.usage:
            details = chunk.usage.prompt_tokens_details
            cached = details.cached_tokens if details else 0
    return {"ttft_s": first - sent, "cached_tokens": cached, "token_sha": sha}


def ttft(
    image: str, device: str, tokens: int, reps: int, vocab: int, extra: tuple[str, ...], logs: Path
) -> dict:
    from openai import OpenAI

    rows = []
    common = ("--model-name", "m", "--max-seqs", "2", *extra)
    opts = {"env": ENV, "device": device, "ready_s": 600.0}  # a first start on a GPU compiles its kernels
    with ServerProcess(image, *common, "--no-prefix-cache", log=logs / "plain.log", **opts) as plain, \
            ServerProcess(image, *common, "--prefix-cache-gib", "8", log=logs / "caching.log", **opts) as caching:  # fmt: skip
        fresh = OpenAI(base_url=plain.url + "/v1", api_key="b", max_retries=0, timeout=900)
        cached = OpenAI(base_url=caching.url + "/v1", api_key="b", max_retries=0, timeout=900)
        first_token(fresh, [1, 2, 3])
        first_token(cached, [1, 2, 3])
        for rep in range(reps):
            turn1 = ids(tokens, 100 + rep, vocab)
            first_token(cached, turn1)
            turn2 = turn1 + ids(NEW, 200 + rep, vocab)
            a, b = first_token(fresh, turn2), first_token(cached, turn2)
            rows.append({"prompt_tokens": len(turn2), "uncached_ttft_s": a["ttft_s"], "cached_ttft_s": b["ttft_s"],
                         "cached_tokens": b["cached_tokens"], "same_token": a["token_sha"] == b["token_sha"]})  # fmt: skip
    u = statistics.median(r["uncached_ttft_s"] for r in rows)
    c = statistics.median(r["cached_ttft_s"] for r in rows)
    return {"reps": rows, "uncached_ttft_median_s": u, "cached_ttft_median_s": c, "speedup": u / c}


def copy_floor(nbytes: int, device: str, reps: int) -> float:
    """Median seconds of one host-to-device copy of `nbytes` from page-locked memory (on the CPU: a memcpy)."""
    import torch

    cuda = device == "cuda"
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    out = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        sync()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def restore_rate(image: str, device: str, tokens: int, reps: int, vocab: int) -> dict:
    import torch
    from tfc.runtime.options import RuntimeOptions
    from tfc.runtime.worker.step import SequenceStep, StepPlan
    from tfc.runtime.worker.worker import Worker

    w = Worker.start(image, device=device, options=RuntimeOptions(graphs=False))
    try:
        w.load_model(dtype=torch.float32, slots=2, tokens_per_slot=tokens + 64)
        prompt, step = ids(tokens, 7, vocab), 256
        for lo in range(0, tokens, step):
            w.execute(StepPlan((SequenceStep(0, tuple(prompt[lo : lo + step]), lo),)))
        host = w.snapshot(0).to_host()
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        times, host_times = [], []
        for _ in range(reps):
            w.release(1)  # into a released slot, as the engine restores (untimed)
            sync()
            t = time.perf_counter()
            w.restore(1, host)
            host_times.append(time.perf_counter() - t)  # until the host is free again (the copies queued)
            sync()
            times.append(time.perf_counter() - t)
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()  # where the host's time goes (what a restore's wall time follows)
        for _ in range(20):
            w.release(1)
            sync()
            prof.enable()
            w.restore(1, host)
            prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
        host_profile = [line[:200] for line in buf.getvalue().splitlines() if line.strip()][-15:]
        back = w.snapshot(1).to_host()  # the restored slot holds the snapshot's rows, byte for byte
        same = back.to_bytes() == host.to_bytes()
        r, f = statistics.median(times), copy_floor(host.nbytes, device, reps)
        return {"runner": w.kind, "bytes": host.nbytes, "reps": reps, "restore_s": r, "restore_all_s": times, "host_s": statistics.median(host_times), "host_profile_20": host_profile, "restored_equal": same, "restore_gb_s": host.nbytes / r / 1e9,
                "copy_floor_gb_s": host.nbytes / f / 1e9, "ratio_to_floor": f / r,
                "floor": "pinned host -> device copy" if device == "cuda" else "host memcpy (CPU run)"}  # fmt: skip
    finally:
        w.close()


def restore_rate_flash_kv(device: str, tokens: int, reps: int) -> dict:
    """The same host-tier restore at the whole Flash model's KV geometry (40 layers, TP=1; no weights needed): a
    slot's KV rows (random bytes) at `tokens`, its snapshot's host copy restored into another slot (the runner's
    keeping of the fed ids timed with it), against the pinned copy of as many bytes, same process."""
    import numpy as np
    import torch
    from decode_h200 import flash_config
    from tfc.runtime.models.dsv41.fast.fed_tokens import FedTokens
    from tfc.runtime.models.dsv41.fast.graph_keys import MAX_ROWS
    from tfc.runtime.models.dsv41.fast.kv.layout import kv_layout
    from tfc.runtime.models.dsv41.fast.kv.memory import KvMemory
    from tfc.runtime.models.dsv41.fast.kv.snapshot import restore, snapshot

    dev = torch.device(device)
    cfg = flash_config()
    per_slot = tokens + 64
    kv = KvMemory(kv_layout(cfg, MAX_ROWS), 2, 2 * per_slot, per_slot, per_slot, dev)
    kv.base.copy_(
        torch.randint(0, 256, kv.base.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    )
    kv.ensure(0, tokens)
    fed = tuple(np.random.default_rng(1).integers(1, cfg.vocab_size, tokens).tolist())
    host = snapshot(kv, 0, fed).to_host()
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    times = []
    for _ in range(reps + 1):  # the first compiles the kernel: not counted (serve's warm-up restores once)
        kv.release(1)
        sync()
        t = time.perf_counter()
        restore(kv, 1, host)
        ids = FedTokens(host.tokens)  # what the runner keeps of a restored slot
        sync()
        times.append(time.perf_counter() - t)
    same = snapshot(kv, 1, tuple(ids)).to_host().to_bytes() == host.to_bytes()
    r, f = statistics.median(times[1:]), copy_floor(host.nbytes, device, reps)
    return {"geometry": f"Flash KV, {cfg.num_hidden_layers} layers, TP=1", "tokens": tokens, "bytes": host.nbytes,
            "reps": reps, "restore_s": r, "restore_all_s": times, "restored_equal": same, "restore_gb_s": host.nbytes / r / 1e9,
            "copy_floor_s": f, "copy_floor_gb_s": host.nbytes / f / 1e9, "ratio_to_floor": f / r}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--image", help="a prepared image's rank folder (default: build the tiny one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tokens", type=int, default=3500, help="turn 1's prompt ids")
    ap.add_argument(
        "--reps", type=int, default=3, help="TTFT repeats (each boots two servers; 0: the restore part only)"
    )
    ap.add_argument("--restore-reps", type=int, default=9, help="host-tier restores timed (and copies)")
    ap.add_argument("--vocab", type=int, default=600, help="ids are drawn from [1, vocab)")
    ap.add_argument(
        "--tokenizer", help="a tokenizer.json for an image that carries none (tfc serve --tokenizer)"
    )
    ap.add_argument("--no-draft", action="store_true", help="serve (and generate) with --no-draft")
    ap.add_argument("--flash-kv", action="store_true",
                    help="also the restore at the whole Flash model's KV geometry (no image: random KV bytes)")  # fmt: skip
    args = ap.parse_args()
    extra = (("--tokenizer", args.tokenizer) if args.tokenizer else ()) + (
        ("--no-draft",) if args.no_draft else ()
    )
    with tempfile.TemporaryDirectory() as tmp:
        image = args.image or build_image(Path(tmp))
        res: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}",
                     "image": args.image or "tfc fixture tiny, TP=1", "device": args.device, "tokens": args.tokens}  # fmt: skip
        if args.reps:
            res["ttft"] = ttft(image, args.device, args.tokens, args.reps, args.vocab, extra, Path(tmp))
        res["restore"] = restore_rate(image, args.device, args.tokens, args.restore_reps, args.vocab)
        if args.flash_kv:
            res["restore_flash_kv"] = restore_rate_flash_kv(args.device, args.tokens, args.restore_reps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: res[k] for k in ("ttft", "restore", "restore_flash_kv") if k in res}, indent=1))


if __name__ == "__main__":
    main()
