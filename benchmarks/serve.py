#!/usr/bin/env python3
"""`tfc serve` loaded by `tfc bench`: aggregate decode at several concurrent streams, one stream against
`tfc generate` on the same image, and restarts to ready.

    python benchmarks/serve.py [--device cuda] [--image IMG/rank0] [--streams 1,16,64] [--against-no-draft]
        [--long-prompt 4096 [--long-streams 32]] [--json]
    python benchmarks/serve.py --device cpu --streams 1,4 --output-len 16          # the tiny image, small counts

IMG: any prepared image (default: the tiny pack, prepared in a temporary folder); an image without a tokenizer (the
Flash slice of `tfc fixture flash-random`) is served with one naming every id (`<i>`), so replies are text. In one
run: --reps pairs of `tfc generate --ignore-eos --json` (its decode rate after the first token) and one streamed
request through the server (`tfc bench --concurrency 1`: 1 / TPOT), interleaved so the machine's load hits both
alike; then `tfc bench --concurrency C --ignore-eos` for each C of --streams (output tok/s over the setting's
wall time); then --restarts starts of `tfc serve` to /health ready (the first start on a GPU builds the kernels
into the store's cache: it is timed apart). The server runs with its defaults and --max-seqs at the largest C.
--against-no-draft benches a `--no-draft` server at the same settings (drafting's cost or gain, and each level's
drafting rounds); --long-prompt W sends one W-word prompt while --long-streams streams decode (`tfc bench`) and
times its first token and those streams' output rate against the same run without it.

On a Flash slice, whole-Flash tok/s is projected from the slice's aggregate by the weights a token multiplies
(Flash's layers and head over the slice's, decode.active_params): the step's time taken to grow with its weights.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c
from tfc.runtime.parallel.ports import free_port

PROMPT = "The model reads the prompt"
PEERS = "2x H200 at TP=2: ~4.4K tok/s bound at 64 streams; SGLang ~2.4K at 256 (V4-Flash, 4x H200); vLLM 801 at 16"


class Server:
    """`tfc serve IMAGE ARGS` in a child process on 127.0.0.1: `url`, `ready_s` (spawn -> /health 200), `stop`."""

    def __init__(self, image: str | Path, *args: str, device: str, log: Path, ready_s: float = 600.0) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = log
        started = time.perf_counter()
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                c.tfc_command("serve", str(image), "--port", self.url.rsplit(":", 1)[1], "--device", device, *args),
                stdout=out, stderr=subprocess.STDOUT, cwd=tempfile.gettempdir(),
                env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
            )  # fmt: skip
        deadline = started + ready_s
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"tfc serve exited with {self.proc.returncode}: {self.log.read_text()[-1500:]}"
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        self.ready_s = time.perf_counter() - started
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tfc serve was not ready within {ready_s} s: {self.log.read_text()[-1500:]}")

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def id_tokenizer(path: Path, vocab: int) -> Path:
    """A tokenizer.json naming every id ("<0>" .. "<N-1>", words split on whitespace, unknown words id 0)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({f"<{i}>": i for i in range(vocab)}, unk_token="<0>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(path))
    return path


def image_facts(image: Path) -> dict:
    """Whether the image is a Flash slice, carries a tokenizer, and its vocabulary and weights a token."""
    from decode import active_params, flash_config, image_config

    m, cfg = image_config(image)
    flash = flash_config()
    is_slice = cfg.hidden_size == flash.hidden_size and cfg.num_hidden_layers < flash.num_hidden_layers
    ratio = active_params(m.segments, cfg, cfg) / active_params(m.segments, cfg, flash) if is_slice else None
    return {"slice": is_slice, "tokenizer": any(s.name == "tokenizer.json" for s in m.segments),
            "vocab": cfg.vocab_size, "slice_over_flash_weights": ratio}  # fmt: skip


def bench(url: str, concurrency: int, requests: int, args) -> dict:
    """One `tfc bench` setting's JSON line."""
    line = c.tfc("bench", url, "--concurrency", str(concurrency), "--requests", str(requests), "--input-len",
                 str(args.input_len), "--output-len", str(args.output_len), "--ignore-eos", "--json", timeout=1800)  # fmt: skip
    return json.loads(line)


def level(url: str, concurrency: int, args) -> dict:
    """`tfc bench` at this concurrency (2 x C requests, at least 8), with the drafting rounds it caused."""
    before = drafting(url)
    out = bench(url, concurrency, max(8, 2 * concurrency), args)
    after = drafting(url)
    out["drafting"] = {k: after[k] - before[k] for k in after}
    return out


def long_prompt(url: str, streams: int, words: int, args) -> dict:
    """The time to the first token of one `words`-word prompt sent while `streams` streams decode, and those streams'
    output rate and inter-token p99 with it against a run without it (the same `tfc bench` setting)."""
    quiet = bench(url, streams, streams, args)
    cmd = c.tfc_command("bench", url, "--concurrency", str(streams), "--requests", str(streams), "--input-len",
                        str(args.input_len), "--output-len", str(args.output_len), "--ignore-eos", "--json")  # fmt: skip
    busy = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=tempfile.gettempdir())
    time.sleep((quiet["ttft_ms"]["p99"] + 4 * quiet["tpot_ms"]["p50"]) / 1e3)  # every stream decoding by now
    with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:
        model = json.loads(r.read())["data"][0]["id"]
    body = json.dumps({"model": model, "prompt": "tokens " * words, "max_tokens": 1}).encode()
    ask = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
    started = time.perf_counter()
    with urllib.request.urlopen(ask, timeout=1800) as r:
        prompt_tokens = json.loads(r.read())["usage"]["prompt_tokens"]
    ttft = time.perf_counter() - started
    out, _ = busy.communicate(timeout=1800)
    loaded = json.loads(out.strip().splitlines()[-1])
    return {"streams": streams, "prompt_tokens": prompt_tokens, "ttft_s": ttft,
            "quiet_tok_s": quiet["output_tok_s"], "busy_tok_s": loaded["output_tok_s"],
            "quiet_itl_p99_ms": quiet["itl_ms"]["p99"], "busy_itl_p99_ms": loaded["itl_ms"]["p99"]}  # fmt: skip


def drafting(url: str) -> dict:
    """The server's drafting counts so far (/health): rounds, drafted and accepted tokens."""
    with urllib.request.urlopen(url + "/health", timeout=10) as r:
        d = json.loads(r.read())["drafting"]
    return {k: d[k] for k in ("drafts", "draft_tokens", "accepted_tokens")}


def generate_rate(image: Path, device: str, extra: list[str], tokens: int) -> float:
    out = json.loads(c.tfc("generate", str(image), "--prompt", PROMPT, "--max-tokens", str(tokens), "--ignore-eos",
                           "--device", device, "--json", *extra, timeout=900))  # fmt: skip
    return out["decode_tok_s"]


def main() -> None:
    ap = c.parser(__doc__)
    ap.add_argument("--image", help="a prepared image's rank folder (default: the tiny pack, prepared here)")
    ap.add_argument("--streams", default="1,16,64", help="tfc bench concurrencies, comma-separated")
    ap.add_argument(
        "--output-len", type=int, default=128, help="tokens a request asks for (with --ignore-eos)"
    )
    ap.add_argument("--input-len", type=int, default=128, help="prompt words a request sends")
    ap.add_argument("--reps", type=int, default=3, help="generate / one-stream pairs (medians)")
    ap.add_argument("--restarts", type=int, default=3, help="starts to /health ready (median)")
    ap.add_argument(
        "--long-prompt",
        type=int,
        default=0,
        metavar="WORDS",
        help="also time one prompt of this many words sent while --long-streams streams decode",
    )
    ap.add_argument("--long-streams", type=int, default=32, help="the streams decoding around --long-prompt")
    ap.add_argument("--against-no-draft", action="store_true",
                    help="also bench a --no-draft server at the same streams: what drafting costs or gives")  # fmt: skip
    args = ap.parse_args()
    try:
        streams = [int(s) for s in args.streams.split(",")]
    except ValueError:
        ap.error(f"--streams takes comma-separated integers, got {args.streams!r}")
    if min(streams) < 1 or args.reps < 1 or args.restarts < 1 or args.output_len < 2:
        ap.error("--streams, --reps and --restarts take positive numbers, --output-len at least 2")
    device = c.pick_device(args.device)
    c.ensure_tfc()
    run = c.Run("serve", "serve.py", device, args.commit)
    with tempfile.TemporaryDirectory() as tmp:
        image = Path(args.image) if args.image else Path(c.tiny_image(Path(tmp))) / "rank0"
        facts = image_facts(image)
        extra = (
            []
            if facts["tokenizer"]
            else ["--tokenizer", str(id_tokenizer(Path(tmp) / "ids.json", facts["vocab"]))]
        )
        seqs = max(*streams, args.long_streams + 1 if args.long_prompt else 1)  # the long prompt finds a slot
        serve_args = ["--max-seqs", str(seqs), *extra]
        run.data.update(image=str(image), facts=facts, streams=streams, output_len=args.output_len)
        if device == "cuda":  # the first start builds the kernels into the store's cache: timed apart
            with Server(image, *serve_args, device=device, log=Path(tmp) / "first.log") as first:
                run.data["first_start_s"] = first.ready_s
        pairs = []
        with Server(image, *serve_args, device=device, log=Path(tmp) / "serve.log") as server:
            bench(server.url, 1, 1, args)  # warms the route and the one-row step
            for _ in range(args.reps):
                gen = generate_rate(image, device, extra, args.output_len)
                one = bench(server.url, 1, 1, args)
                pairs.append({"generate_tok_s": gen, "http_tok_s": 1e3 / one["tpot_ms"]["p50"]})
            levels = [level(server.url, s, args) for s in streams]
            long = (
                long_prompt(server.url, args.long_streams, args.long_prompt, args)
                if args.long_prompt
                else None
            )
        plain = []
        if args.against_no_draft:
            with Server(
                image, *serve_args, "--no-draft", device=device, log=Path(tmp) / "plain.log"
            ) as server:
                bench(server.url, 1, 1, args)
                plain = [level(server.url, s, args) for s in streams]
        for lv in levels:
            d = lv["drafting"]
            print(f"[serve] {lv['concurrency']} streams: {lv['output_tok_s']:,.1f} tok/s out, TTFT p50 "
                  f"{lv['ttft_ms']['p50']:,.0f} ms, TPOT p50 {lv['tpot_ms']['p50']:,.1f} ms, {lv['failed']} failed; "
                  f"{d['drafts']} drafting rounds, {d['accepted_tokens']} of {d['draft_tokens']} drafts kept")  # fmt: skip
        starts = []
        for i in range(args.restarts):
            with Server(image, *serve_args, device=device, log=Path(tmp) / f"start{i}.log") as s:
                starts.append(s.ready_s)
            time.sleep(0.5)
    gen, http = c.median(p["generate_tok_s"] for p in pairs), c.median(p["http_tok_s"] for p in pairs)
    run.data.update(pairs=pairs, levels=levels, starts_s=starts, no_draft_levels=plain, long_prompt=long)
    if long:
        print(f"[serve] a {long['prompt_tokens']:,}-token prompt beside {long['streams']} decoding streams: first "
              f"token in {long['ttft_s']:.2f} s; the streams {long['busy_tok_s']:,.1f} tok/s with it, "
              f"{long['quiet_tok_s']:,.1f} without (inter-token p99 {long['busy_itl_p99_ms']:,.0f} against "
              f"{long['quiet_itl_p99_ms']:,.0f} ms)", flush=True)  # fmt: skip
    for lv, pl in zip(levels, plain, strict=False):
        print(f"[serve] {lv['concurrency']} streams: drafting on {lv['output_tok_s']:,.1f} tok/s, --no-draft "
              f"{pl['output_tok_s']:,.1f}", flush=True)  # fmt: skip
        if facts["slice"]:
            run.metric(f"serve.draft_vs_no_draft.streams{lv['concurrency']}", lv["output_tok_s"] / pl["output_tok_s"],
                       "fraction", ">= 0.95", f"a --no-draft server, same run ({pl['output_tok_s']:,.0f} tok/s)")  # fmt: skip
    print(f"[serve] one stream: HTTP {http:,.1f} tok/s against tfc generate {gen:,.1f}; restarts "
          f"{', '.join(f'{s:.2f}' for s in starts)} s", flush=True)  # fmt: skip
    # the pair's figure names its image; a short reply measures the first rounds of drafting, not decode
    kind = (
        ("slice" if facts["slice"] else "tiny" if not args.image else None) if args.output_len >= 64 else None
    )
    if kind:
        run.metric(f"serve.one_stream_vs_generate.{kind}", http / gen, "fraction", ">= 0.95",
                   f"`tfc generate` on the same image, same run ({gen:,.1f} tok/s)")  # fmt: skip
    if facts["slice"]:
        run.metric("serve.start_to_ready_s.slice", c.median(starts), "s", "<= 6",
                   "a restart: the kernels in the store's cache, the image in the page cache")  # fmt: skip
        if long:
            run.metric(f"serve.long_prompt_ttft_s.streams{long['streams']}", long["ttft_s"], "s", None,
                       f"a {long['prompt_tokens']:,}-token prompt's first token beside {long['streams']} decoding "
                       "streams; vLLM prefills 12.0K tok/s at 32k (4x RTX PRO 6000)")  # fmt: skip
            run.metric(f"serve.decode_during_long_prompt.streams{long['streams']}",
                       long["busy_tok_s"] / long["quiet_tok_s"], "fraction", None,
                       f"the same streams without the long prompt ({long['quiet_tok_s']:,.0f} tok/s)")  # fmt: skip
        at64 = next((lv for lv in levels if lv["concurrency"] == 64), None)
        if at64:
            run.metric("serve.whole_flash_tok_s.streams64", at64["output_tok_s"] * facts["slice_over_flash_weights"],
                       "tok/s", ">= 1500 on an H200", f"the slice's {at64['output_tok_s']:,.0f} tok/s; {PEERS}")  # fmt: skip
    run.finish(args.json)


if __name__ == "__main__":
    main()
