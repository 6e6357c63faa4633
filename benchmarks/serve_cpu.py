"""Serving benchmark on the CPU: one stream through HTTP against `tfc generate`, 1/4/16 streams, start-to-ready.

    python benchmarks/serve_cpu.py --out benchmarks/results/serve/serve_cpu.json

Builds the tiny image in a temporary folder, then, in one run and interleaved so the machine's load hits
both alike: `tfc generate --json --ignore-eos` (its decode rate after the first token) and one streamed
completion through `tfc serve` with the official openai client, each `--reps` times; then `--reqs-per`
streams per concurrency level at 1, 4 and 16 in flight; then `--ready-reps` starts to /health ready.
Both sides run with OMP_NUM_THREADS=1 (a 2-core machine oversubscribed by torch's threads measures noise).

Formulas (serving-peers.md section 3.2 warns tools name these differently):
  decode tok/s (one stream)  = (completion tokens - 1) / (time of the last token - time of the first token)
                               tfc generate: its own clock around the sampler; HTTP: arrival of the first and
                               last text chunk at the client
  TTFT                       = request sent -> first text chunk received
  TPOT                       = (last chunk - first chunk) / (completion tokens - 1), per request
  output tok/s (a level)     = all completion tokens of the level / wall time of the level
  start-to-ready             = process spawned -> first 200 from /health
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from support.server import ServerProcess  # noqa: E402

PROMPT = "The model reads the prompt"
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def tfc(*args: str) -> str:
    r = subprocess.run([sys.executable, "-m", "tfc", *args], capture_output=True, text=True, check=True,
                       env={**os.environ, **ENV}, cwd=tempfile.gettempdir())  # fmt: skip
    return r.stdout.strip().splitlines()[-1]


def build_image(tmp: Path) -> str:
    tfc("fixture", "tiny", str(tmp / "pack"))
    return tfc("prepare", str(tmp / "pack"), "--tp", "1", "--store", str(tmp / "store"))


EXTRA: list[str] = []  # options for an image without a tokenizer: ["--tokenizer", FILE] (serve and generate)


def generate_rate(image: str, tokens: int, device: str = "cpu") -> dict:
    out = json.loads(tfc("generate", image, "--prompt", PROMPT, "--max-tokens", str(tokens), "--ignore-eos",
                         "--device", device, "--json", *EXTRA))  # fmt: skip
    return {"decode_tok_s": out["decode_tok_s"], "tokens": len(out["tokens"]), "token_sha": out["token_sha"]}


def stream_one(client, tokens: int, prompt: str = PROMPT) -> dict:
    sent = time.perf_counter()
    times, n, sha = [], 0, None
    for chunk in client.completions.create(model="tiny", prompt=prompt, max_tokens=tokens, temperature=0,
                                           stream=True, stream_options={"include_usage": True},
                                           extra_body={"ignore_eos": True}):  # fmt: skip
        now = time.perf_counter()
        if chunk.choices and chunk.choices[0].text:
            times.append(now)
        if chunk.choices and chunk.choices[0].finish_reason:
            sha = getattr(chunk.choices[0], "token_sha", None)
        if chunk.usage:
            n = chunk.usage.completion_tokens
    first, last = times[0], times[-1]
    return {"ttft_s": first - sent, "tpot_s": (last - first) / max(1, n - 1), "e2e_s": last - sent,
            "tokens": n, "decode_tok_s": (n - 1) / (last - first) if last > first else 0.0, "token_sha": sha}  # fmt: skip


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def level(client, streams: int, reqs: int, tokens: int) -> dict:
    prompts = [f"{PROMPT} {i}" for i in range(reqs)]
    started = time.perf_counter()
    with ThreadPoolExecutor(streams) as pool:
        rows = list(pool.map(lambda p: stream_one(client, tokens, p), prompts))
    wall = time.perf_counter() - started
    out = {
        "streams": streams,
        "requests": reqs,
        "wall_s": wall,
        "output_tok_s": sum(r["tokens"] for r in rows) / wall,
    }
    for key in ("ttft_s", "tpot_s", "e2e_s"):
        vals = [r[key] for r in rows]
        out[key] = {"median": statistics.median(vals), "p99": pct(vals, 0.99)}
    return out


PHASE = re.compile(r'^tfc:boot_phase_seconds\{[^}]*phase="([^"]+)"[^}]*\} (\S+)$', re.M)


def ready_time(image: str, device: str = "cpu") -> dict:
    """Process spawned -> /health ready, and the boot phases the server reports (tfc:boot_phase_seconds)."""
    started = time.perf_counter()
    proc = ServerProcess(image, "--model-name", "tiny", *EXTRA, env=ENV, device=device)
    try:
        proc.wait_ready(600)
        ready = time.perf_counter() - started
        _, text, _ = proc.get("/metrics")
        return {"ready_s": ready, "phases_s": {k: float(v) for k, v in PHASE.findall(str(text))}}
    finally:
        proc.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--reqs-per", type=int, default=16)
    ap.add_argument("--level-tokens", type=int, default=24)
    ap.add_argument("--ready-reps", type=int, default=3)
    ap.add_argument("--image", help="serve this prepared image instead of building the tiny one")
    ap.add_argument("--device", default="cpu", help="cpu (the reference forward) or cuda (the fast forward)")
    ap.add_argument("--no-levels", action="store_true", help="skip the 1/4/16-stream levels")
    ap.add_argument(
        "--tokenizer", help="a tokenizer.json for an image that carries none (tfc serve --tokenizer)"
    )
    ap.add_argument("--no-draft", action="store_true", help="serve (and generate) with --no-draft")
    args = ap.parse_args()
    if args.tokenizer:
        EXTRA.extend(("--tokenizer", args.tokenizer))
    if args.no_draft:
        EXTRA.append("--no-draft")
    from openai import OpenAI

    with tempfile.TemporaryDirectory() as tmp:
        image = args.image or build_image(Path(tmp))
        result: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}",
                        "image": args.image or "tfc fixture tiny, TP=1", "device": args.device,
                        "generate": [], "http": []}  # fmt: skip
        if args.device != "cpu":  # the first start compiles the kernels into the store; time the restarts
            result["first_start"] = ready_time(image, args.device)
        with ServerProcess(
            image,
            "--model-name",
            "tiny",
            "--max-seqs",
            "16",
            *EXTRA,
            env=ENV,
            device=args.device,
            ready_s=600.0,
            log=Path(tmp) / "serve.log",
        ) as server:
            client = OpenAI(base_url=server.url + "/v1", api_key="bench", max_retries=0, timeout=600)
            stream_one(client, 4)  # warm the route
            for _ in range(args.reps):
                result["generate"].append(generate_rate(image, args.tokens, args.device))
                result["http"].append(stream_one(client, args.tokens))
            result["levels"] = [] if args.no_levels else [
                level(client, c, max(c, args.reqs_per), args.level_tokens) for c in (1, 4, 16)
            ]  # fmt: skip
        result["starts"] = [ready_time(image, args.device) for _ in range(args.ready_reps)]
        result["start_to_ready_s"] = [r["ready_s"] for r in result["starts"]]
        result["load_after"] = os.getloadavg()[0]
    gen = statistics.median(r["decode_tok_s"] for r in result["generate"])
    http = statistics.median(r["decode_tok_s"] for r in result["http"])
    result["summary"] = {"generate_decode_tok_s": gen, "http_decode_tok_s": http, "http_over_generate": http / gen,
                         "same_tokens": all(g["token_sha"] == h["token_sha"] for g, h in
                                            zip(result["generate"], result["http"], strict=True)),
                         "start_to_ready_median_s": statistics.median(result["start_to_ready_s"])}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    s = result["summary"]
    print(f"one stream: generate {gen:.2f} tok/s, HTTP {http:.2f} tok/s = {s['http_over_generate']:.1%} "
          f"(same tokens: {s['same_tokens']})")  # fmt: skip
    for lv in result["levels"]:
        print(f"{lv['streams']:>2} streams: {lv['output_tok_s']:.1f} tok/s out; TTFT median {lv['ttft_s']['median']*1e3:.0f} ms "
              f"p99 {lv['ttft_s']['p99']*1e3:.0f} ms; TPOT median {lv['tpot_s']['median']*1e3:.1f} ms "
              f"p99 {lv['tpot_s']['p99']*1e3:.1f} ms")  # fmt: skip
    print(f"start-to-ready: {', '.join(f'{t:.2f}' for t in result['start_to_ready_s'])} s")


if __name__ == "__main__":
    main()
