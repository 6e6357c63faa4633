#!/usr/bin/env python3
"""The prefix cache: time to first token of a long conversation's next turn, cached against uncached, and a
host-tier restore against the pinned host-to-device copy of as many bytes.

    python benchmarks/prefix_cache.py [--device cpu] [--tokens 3500] [--json]             # the tiny image
    python benchmarks/prefix_cache.py --device cuda --image IMG/rank0 --tokens 16000 --json  # the Flash slice

TTFT (through `tfc serve` and the official openai client, token-id prompts so turn 2 extends turn 1's ids
exactly): two servers side by side, `--no-prefix-cache` and the cache's device tier. Each of --reps sends turn 1
(--tokens ids, a rep-unique start) to the caching server, then turn 2 (turn 1's ids and 64 new ones) to both,
streamed, one token: TTFT = request sent -> first chunk; both servers must return the same token (resumed ==
fresh). Restore (CUDA, in process, no weights): a slot's KV rows at the whole Flash model's geometry (40 layers,
TP=1, random bytes) at --tokens, its snapshot's host copy restored into another slot (the runner's keeping of the
fed ids timed with it), median of --restore-reps, against the pinned copy of as many bytes in the same process.
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c
from serve import Server, id_tokenizer, image_facts

NEW = 64


def ids(n: int, seed: int, vocab: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, vocab) for _ in range(n)]


def first_token(client, prompt: list[int]) -> dict:
    sent = time.perf_counter()
    first, sha, cached = None, None, None
    for chunk in client.completions.create(model="m", prompt=prompt, max_tokens=1, temperature=0,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True}):  # fmt: skip
        if first is None and chunk.choices:
            first = time.perf_counter()
        if chunk.choices and chunk.choices[0].finish_reason:
            sha = getattr(chunk.choices[0], "token_sha", None)
        if chunk.usage:
            details = chunk.usage.prompt_tokens_details
            cached = details.cached_tokens if details else 0
    return {"ttft_s": first - sent, "cached_tokens": cached, "token_sha": sha}


def ttft(image: Path, device: str, tokens: int, reps: int, vocab: int, extra: list[str], tmp: Path) -> dict:
    from openai import OpenAI

    common = ("--model-name", "m", "--max-seqs", "2", *extra)
    rows = []
    with Server(image, *common, "--no-prefix-cache", device=device, log=tmp / "plain.log") as plain, \
            Server(image, *common, "--prefix-cache-gib", "8", device=device, log=tmp / "caching.log") as caching:  # fmt: skip
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
    if not all(r["same_token"] for r in rows):
        raise RuntimeError(f"the cached turn's token differs from the uncached one's: {rows}")
    u, k = (
        statistics.median(r["uncached_ttft_s"] for r in rows),
        statistics.median(r["cached_ttft_s"] for r in rows),
    )
    return {"reps": rows, "uncached_s": u, "cached_s": k, "speedup": u / k}


def pinned_copy_s(nbytes: int, reps: int) -> float:
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    out = []
    for _ in range(reps + 1):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        out.append(time.perf_counter() - t0)
    return statistics.median(out[1:])


def restore_flash_kv(tokens: int, reps: int) -> dict:
    """A host-tier restore at the whole Flash model's KV geometry against the pinned copy of its bytes."""
    import numpy as np
    import torch
    from decode import flash_config
    from tfc.runtime.models.dsv41.fast.fed_tokens import FedTokens
    from tfc.runtime.models.dsv41.fast.graph_keys import SEQ_ROWS
    from tfc.runtime.models.dsv41.fast.kv.layout import kv_layout
    from tfc.runtime.models.dsv41.fast.kv.memory import KvMemory
    from tfc.runtime.models.dsv41.fast.kv.snapshot import restore, snapshot

    cfg = flash_config()
    per_slot = tokens + 64
    kv = KvMemory(kv_layout(cfg, SEQ_ROWS), 2, 2 * per_slot, per_slot, per_slot, torch.device("cuda"))
    kv.base.copy_(
        torch.randint(0, 256, kv.base.shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    )
    kv.ensure(0, tokens)
    fed = tuple(np.random.default_rng(1).integers(1, cfg.vocab_size, tokens).tolist())
    host = snapshot(kv, 0, fed).to_host()
    times = []
    for _ in range(reps + 1):  # the first loads the copy kernel: not counted (serve's warm-up restores once)
        kv.release(1)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        restore(kv, 1, host)
        kept = FedTokens(host.tokens)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    if snapshot(kv, 1, tuple(kept)).to_host().to_bytes() != host.to_bytes():
        raise RuntimeError("the restored slot differs from its snapshot")
    r, f = statistics.median(times[1:]), pinned_copy_s(host.nbytes, reps)
    return {"layers": cfg.num_hidden_layers, "tokens": tokens, "bytes": host.nbytes, "restore_s": r, "copy_s": f,
            "ratio": f / r}  # fmt: skip


def main() -> None:
    ap = c.parser(__doc__)
    ap.add_argument("--image", help="a prepared image's rank folder (default: the tiny pack, prepared here)")
    ap.add_argument(
        "--tokens", type=int, default=3500, help="turn 1's prompt ids (the tiny image holds 4,096)"
    )
    ap.add_argument("--reps", type=int, default=2, help="TTFT repeats (0: the restore alone)")
    ap.add_argument("--restore-reps", type=int, default=15, help="host-tier restores timed (CUDA)")
    ap.add_argument("--vocab", type=int, default=600, help="prompt ids are drawn from [1, vocab)")
    args = ap.parse_args()
    device = c.pick_device(args.device)
    c.ensure_tfc()

    run = c.Run("prefix_cache", "prefix_cache.py", device, args.commit)
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(args.image) if args.image else Path(c.tiny_image(Path(tmp))) / "rank0"
        facts = image_facts(image)
        extra = (
            []
            if facts["tokenizer"]
            else ["--tokenizer", str(id_tokenizer(Path(tmp) / "ids.json", facts["vocab"]))]
        )
        run.data.update(image=str(image), tokens=args.tokens)
        if args.reps:
            t = run.data["ttft"] = ttft(image, device, args.tokens, args.reps, args.vocab, extra, Path(tmp))
            print(f"[prefix] next turn of {args.tokens + NEW} ids: {t['uncached_s']:.3f} s uncached, "
                  f"{t['cached_s']:.3f} s cached ({t['speedup']:.1f}x)", flush=True)  # fmt: skip
            # a summary id names its image and turn length: the 16k turn of the slice, the 3,500 ids of the tiny one
            kind = {(True, 16000): "slice16k", (False, 3500): "tiny"}.get((facts["slice"], args.tokens))
            if kind:
                run.metric(f"prefix_cache.ttft_speedup.{kind}", t["speedup"], "x", None,
                           f"the uncached turn through the same server build ({t['uncached_s']:.2f} s against "
                           f"{t['cached_s']:.3f} s)")  # fmt: skip
    if device == "cuda":
        r = run.data["restore"] = restore_flash_kv(args.tokens, args.restore_reps)
        print(f"[prefix] host restore of {r['bytes'] / 1e6:.1f} MB: {r['restore_s'] * 1e3:.3f} ms against a pinned "
              f"copy's {r['copy_s'] * 1e3:.3f} ms", flush=True)  # fmt: skip
        if args.tokens == 16000:
            run.metric("prefix_cache.host_restore_vs_h2d", r["ratio"], "x", ">= 0.8",
                       f"the pinned host-to-device copy of the same {r['bytes'] / 1e6:.1f} MB, same process "
                       f"({r['copy_s'] * 1e3:.3f} ms)")  # fmt: skip
    run.finish(args.json)


if __name__ == "__main__":
    main()
