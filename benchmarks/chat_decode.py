"""Decode tok/s with a JSON schema active against without, in one run, through the engine on an image.

Each round submits the same batch of chat requests twice, once plain and once under `response_format`
json_schema (llguidance mask before every sampled token), alternating which goes first; decode tok/s is
generated tokens after each request's first, over the time from its first token to its last, summed over
the batch (the rate peers report). The prompt of both is rendered with the schema, so prefill is equal.

    .venv/bin/python benchmarks/chat_decode.py IMAGE [--batch 4] [--rounds 3] [--max-tokens 48]
        [--out benchmarks/results/chat/decode.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {"type": "object", "properties": {"notes": {"type": "array", "items": {"type": "string"}},
          "score": {"type": "integer"}}, "required": ["notes", "score"]}  # fmt: skip


async def _batch(engine, requests) -> dict:
    streams = engine.submit(requests)
    firsts, lasts, counts = [], [], []

    async def one(stream):
        first = last = None
        n = 0
        async for event in stream:
            now = time.perf_counter()
            if event.token_ids:
                n += len(event.token_ids)
                first = first if first is not None else now
                last = now
        firsts.append(first)
        lasts.append(last)
        counts.append(n)

    t0 = time.perf_counter()
    await asyncio.gather(*[one(s) for s in streams])
    wall = time.perf_counter() - t0
    decode_tokens = sum(max(0, n - 1) for n in counts)
    span = max(lasts) - min(firsts)
    return {"tokens": sum(counts), "decode_tokens": decode_tokens, "decode_s": round(span, 4),
            "decode_tok_s": round(decode_tokens / span, 3) if span > 0 else 0.0, "wall_s": round(wall, 4)}  # fmt: skip


async def run(args) -> dict:
    import torch
    from tfc.runtime.engine.chat import ChatOptions
    from tfc.runtime.engine.engine import Engine, EngineConfig
    from tfc.runtime.engine.grammar import Grammars
    from tfc.runtime.engine.request import Request
    from tfc.runtime.engine.sampling import SamplingParams
    from tfc.runtime.engine.tokenizer import image_tokenizer
    from tfc.runtime.options import RuntimeOptions
    from tfc.runtime.worker.worker import Worker

    torch.set_num_threads(args.threads)
    worker = Worker.start(args.image, device=args.device, options=RuntimeOptions(graphs=False))
    try:
        runner = worker.load_model(dtype=torch.float32, slots=args.batch)
        tok = image_tokenizer(worker.booted.image, str(args.image))
        chat = worker.chat_format(tok)
        fmt = {"type": "json_schema", "json_schema": {"name": "out", "schema": SCHEMA}}
        plan = chat.plan([{"role": "user", "content": "Write notes."}], ChatOptions(response_format=fmt))
        grammars = Grammars(tok, runner.info.vocab_size, runner.info.eos_ids)
        engine = Engine(worker, tok, EngineConfig(max_seqs=args.batch, max_context=runner.info.context))
        engine.start()

        def requests(constrained: bool, seed: int):
            # no stop ids: both runs generate max_tokens (a grammar that finished only allows EOS from then on)
            return [Request(plan.prompt, SamplingParams(temperature=1.0, seed=seed + i), args.max_tokens,
                            constraint=grammars.compile(plan.grammar) if constrained else None, reader=plan.reader)
                    for i in range(args.batch)]  # fmt: skip

        await _batch(engine, requests(False, 0))  # warm
        rounds = []
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {c: await _batch(engine, requests(c, 100 * r)) for c in order}
            rounds.append({"plain": got[False], "schema": got[True],
                           "ratio": round(got[True]["decode_tok_s"] / got[False]["decode_tok_s"], 4)})  # fmt: skip
            print(json.dumps(rounds[-1]))
        engine.close()
    finally:
        worker.close()
    ratios = [r["ratio"] for r in rounds]
    return {"image": str(args.image), "device": args.device, "threads": args.threads, "batch": args.batch,
            "max_tokens": args.max_tokens, "machine": _machine(), "rounds": rounds,
            "median_ratio": statistics.median(ratios)}  # fmt: skip


def _machine() -> str:
    from cli_flash import _cpu

    return f"{platform.machine()}, {_cpu()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("image", type=Path)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/chat/decode.json")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    report = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"median schema/plain decode ratio {report['median_ratio']:.3f}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
