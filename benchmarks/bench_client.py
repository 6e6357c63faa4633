"""What `tfc bench` itself costs: its process's CPU seconds per streamed chunk, against a local server that
streams OpenAI-shaped chunks at a set pace per request (each chunk its own read, as a model's tokens arrive), so
the client's ceiling, not a model's speed, is measured.

    .venv/bin/python benchmarks/bench_client.py --out benchmarks/results/bench/client_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

CHUNK = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": "m",
         "choices": [{"index": 0, "text": " word", "logprobs": None, "finish_reason": None}]}  # fmt: skip


def app(pace_s: float):
    """A starlette app: /v1/models, and /v1/completions streaming max_tokens chunks `pace_s` apart, usage and
    [DONE]."""
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    frame = f"data: {json.dumps(CHUNK)}\n\n".encode()

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "m"}]})

    async def completions(request):
        n = (await request.json())["max_tokens"]

        async def frames():
            for _ in range(n):
                yield frame
                await asyncio.sleep(pace_s)
            yield f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': n}})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(frames(), media_type="text/event-stream")

    return Starlette(
        routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])]
    )


def run_client(url: str, concurrency: int, requests: int, tokens: int) -> dict:
    """One `tfc bench` process: its JSON summary, and its user + system CPU seconds."""
    cmd = [sys.executable, "-m", "tfc", "bench", url, "--concurrency", str(concurrency), "--requests",
           str(requests), "--output-len", str(tokens), "--input-len", "8", "--json"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    assert status == 0, status
    return {"summary": json.loads(out.splitlines()[-1]), "cpu_s": usage.ru_utime + usage.ru_stime}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the server process's own entry
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument(
        "--pace-ms", type=float, default=2.0, help="The server's pause between a reply's chunks."
    )
    args = parser.parse_args()
    if args.serve:
        import uvicorn

        uvicorn.run(app(args.pace_ms / 1000), host="127.0.0.1", port=args.serve, log_level="warning")
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, __file__, "--out", "-", "--serve", str(port), "--pace-ms", str(args.pace_ms)]
    )
    url = f"http://127.0.0.1:{port}"
    try:
        time.sleep(3)
        rows = []
        for concurrency in (4, 16, 64):
            small = run_client(url, concurrency, concurrency * 2, args.tokens)
            large = run_client(url, concurrency, concurrency * 6, args.tokens)
            chunks = (concurrency * 6 - concurrency * 2) * args.tokens
            per_chunk_us = (large["cpu_s"] - small["cpu_s"]) / chunks * 1e6
            rows.append((concurrency, large, per_chunk_us))
    finally:
        server.terminate()
        server.wait()
    lines = [
        f"# `tfc bench` client CPU per streamed chunk ({platform.node()}, {os.cpu_count()} cores)",
        "",
        f"Command: `.venv/bin/python benchmarks/bench_client.py --out {args.out}`; {args.tokens}-token replies, "
        f"the server pausing {args.pace_ms:g} ms between a reply's chunks; per chunk = (CPU of 6C requests - CPU of 2C requests) / the chunks between them, so start-up drops out.",
        f"Load average at the end: {os.getloadavg()[0]:.2f}.",
        "",
        "| concurrency | client CPU µs / chunk | output tok/s (6C requests) | ITL p50 / p99 ms |",
        "| --- | --- | --- | --- |",
    ]
    for concurrency, large, per_chunk_us in rows:
        s = large["summary"]
        lines.append(f"| {concurrency} | {per_chunk_us:.0f} | {s['output_tok_s']:,.0f} | "
                     f"{s['itl_ms']['p50']:.2f} / {s['itl_ms']['p99']:.2f} |")  # fmt: skip
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
