"""The fast forward's stages as AOTInductor packages against torch's saved functions (#20's start-to-ready): for each
backend, `tfc generate` on an image twice (the first start compiles the stages, the second loads them), with
the wall time of each, the stages' counts, the token_sha and the notes; the second start of the packages is
run under `python -X importtime` as well, to show whether torch.compile's stack (torch._dynamo) was imported.

    python benchmarks/stage_aoti_h200.py --image STORE/KEY/rank0 --out aoti.json [--backends aoti,dynamo]

The store's stage folder is emptied before each backend's first start, so that start compiles every stage.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def generate(image: str, env: dict, tokens: int, tokenizer: str | None, importtime: bool = False) -> dict:
    """One `tfc generate --json` run: wall seconds, the reply's fields, and (importtime) the imports' summary."""
    cmd = [sys.executable, *(["-X", "importtime"] if importtime else []), "-m", "tfc", "generate", image,
           "--device", "cuda", "--prompt", "The model reads the prompt", "--max-tokens", str(tokens),
           "--ignore-eos", "--json", *(["--tokenizer", tokenizer] if tokenizer else [])]  # fmt: skip
    t0 = time.perf_counter()
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd="/tmp")
    wall = time.perf_counter() - t0
    out: dict = {"wall_s": round(wall, 2), "rc": run.returncode}
    try:
        reply = json.loads(run.stdout)
        out |= {
            k: reply.get(k)
            for k in ("token_sha", "warmup_s", "decode_tok_s", "prefill_tok_s", "stages", "runner", "graphs")
        }
    except json.JSONDecodeError:
        out["stderr"] = run.stderr[-1500:]
    if importtime:
        lines = [line for line in run.stderr.splitlines() if line.startswith("import time:")]
        names = [line.rsplit("|", 1)[-1].strip() for line in lines]
        out["imports"] = len(names)
        out["dynamo_imported"] = any(n.strip() == "torch._dynamo" for n in names)
        out["inductor_imported"] = any(n.strip() == "torch._inductor" for n in names)
        cumulative = sorted(((int(line.split("|")[1]), line.rsplit("|", 1)[-1].strip()) for line in lines[:]),
                            reverse=True)  # fmt: skip
        out["heaviest_us"] = cumulative[:12]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--image", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--backends", default="aoti,dynamo")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument(
        "--tokenizer", default=None, help="a tokenizer.json for an image that carries none (the slice)"
    )
    args = ap.parse_args()
    from tfc.runtime.boot.kernel_cache import stage_dir

    folder = stage_dir(Path(args.image), "cuda")
    result: dict = {"image": args.image, "runs": {}}
    for backend in args.backends.split(","):
        if folder is not None and folder.exists():
            shutil.rmtree(folder)  # a real first start for this backend
        env = {**os.environ, "TFC_STAGE_AOTI": "1" if backend == "aoti" else "0"}
        runs = [generate(args.image, env, args.tokens, args.tokenizer) for _ in range(2)]
        if backend == "aoti":
            runs.append(generate(args.image, env, args.tokens, args.tokenizer, importtime=True))
        result["runs"][backend] = runs
        for i, r in enumerate(runs):
            print(f"[{backend} {i}] wall {r['wall_s']} s rc {r['rc']} stages {r.get('stages')} "
                  f"sha {str(r.get('token_sha'))[:12]} decode {r.get('decode_tok_s')} "
                  f"warm-up {r.get('warmup_s')} dynamo {r.get('dynamo_imported')} runner {r.get('runner')} {r.get('stderr', '')[-300:]}", flush=True)  # fmt: skip
        Path(args.out).write_text(json.dumps(result, indent=1))
    shas = {b: [r.get("token_sha") for r in runs] for b, runs in result["runs"].items()}
    result["same_tokens_within_backend"] = {b: len(set(s)) == 1 for b, s in shas.items()}
    result["same_tokens_across_backends"] = len({s for v in shas.values() for s in v}) == 1
    print(
        "same tokens:", result["same_tokens_within_backend"], "across:", result["same_tokens_across_backends"]
    )
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
