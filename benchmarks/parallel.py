#!/usr/bin/env python3
"""Tensor parallelism: a TP=2 image's boot, every rank resident, against its slower rank booted alone, and the
decode rate with the collectives' time a step at TP 1, 2 and 4, on the tiny image.

    python benchmarks/parallel.py [--device cpu] [--reps 3] [--json]     # gloo on the CPU: about 30 s a rep

Prepares the tiny pack at TP 1, 2 and 4, then --reps times, interleaved:
  boot   `tfc load IMAGE --rank R --json` alone for each rank R of the TP=2 image, then `tfc load IMAGE --json`
         (every rank, tfc's launcher); resident_s = the command spawned -> that rank's arena holds its bytes, the
         whole process counted (Python, torch's import, the boot); ratio = the world's last rank resident / the
         slower rank alone;
  steps  `tfc generate IMAGE --json --ignore-eos` at TP 1, 2, 4: decode tok/s, and at TP=N rank 0's time in the
         forward's collectives and in the step broadcast, a step (a collective's time includes waiting for the
         slowest rank), and the token hash, which must be TP=1's.
Every process runs with OMP_NUM_THREADS=1. On CUDA each rank takes a GPU of its own: TP=4 needs four.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c

PROMPT = "The model reads the prompt"
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def load(image: str, device: str, *extra: str) -> dict:
    # the launcher's spawn time, so a rank reports when it was resident counted from the command's start
    env = {**ENV, "TFC_LAUNCH_T0": repr(time.time())}
    return json.loads(c.tfc("load", image, "--json", "--device", device, *extra, env=env, timeout=600))


def boot_round(image: str, device: str) -> dict:
    solo = [load(image, device, "--rank", str(rank)) for rank in (0, 1)]
    world = load(image, device)
    slower = max(s["resident_s"] for s in solo)
    return {"solo_resident_s": [s["resident_s"] for s in solo], "world_resident_s": world["world_resident_s"],
            "ratio": world["world_resident_s"] / slower}  # fmt: skip


def step_round(images: dict[int, str], device: str, tokens: int) -> dict:
    out = {}
    for world, image in images.items():
        g = json.loads(c.tfc("generate", image, "--prompt", PROMPT, "--max-tokens", str(tokens), "--ignore-eos",
                             "--json", "--device", device, env=ENV, timeout=600))  # fmt: skip
        row = {"decode_tok_s": g["decode_tok_s"], "token_sha": g["token_sha"]}
        if "tp" in g:
            tp, steps = g["tp"], g["tp"]["steps"]
            row.update(collective_ms_per_step=tp["collectives"]["seconds"] / steps * 1e3,
                       broadcast_ms_per_step=tp["broadcast_s"] / steps * 1e3)  # fmt: skip
        out[world] = row
    return out


def main() -> None:
    ap = c.parser(__doc__)
    ap.add_argument("--reps", type=int, default=3, help="boot and step rounds (median)")
    ap.add_argument("--tokens", type=int, default=8, help="tokens decoded by each tfc generate")
    ap.add_argument("--worlds", default="1,2,4", help="TP worlds the step round runs")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    try:
        worlds = sorted({1, 2, *(int(w) for w in args.worlds.split(","))})
    except ValueError:
        ap.error(f"--worlds takes comma-separated integers, got {args.worlds!r}")
    device = "cpu" if args.device is None else c.pick_device(args.device)
    if device == "cuda":
        import torch

        if torch.cuda.device_count() < max(worlds):
            c.fail(f"parallel.py: TP={max(worlds)} on CUDA takes {max(worlds)} GPUs, this machine has "
                   f"{torch.cuda.device_count()}; pass --worlds or --device cpu")  # fmt: skip
    run = c.Run("parallel", "parallel.py", device, args.commit)
    with tempfile.TemporaryDirectory() as tmp:
        c.tfc("fixture", "tiny", f"{tmp}/pack")
        images = {
            w: c.tfc("prepare", f"{tmp}/pack", "--tp", str(w), "--store", f"{tmp}/store") for w in worlds
        }
        boots, steps = [], []
        for _ in range(args.reps):
            boots.append(boot_round(images[2], device))
            steps.append(step_round(images, device, args.tokens))
            print(f"[parallel] TP=2 boot {boots[-1]['ratio']:.2f}x its slower rank; decode "
                  + ", ".join(f"TP={w} {r['decode_tok_s']:.1f} tok/s" for w, r in steps[-1].items()), flush=True)  # fmt: skip
    same = all(len({r["token_sha"] for r in s.values()}) == 1 for s in steps)
    ratio = c.median(b["ratio"] for b in boots)
    run.data.update(cores=os.cpu_count(), boots=boots, steps=steps, token_sha_equal=same)
    if not same:
        print("[parallel] TP=N gave another token hash than TP=1", flush=True)
    slower = c.median(max(b["solo_resident_s"]) for b in boots)
    run.metric("parallel.tp2_boot_ratio", ratio, "x", "<= 1.1",
               f"the slower rank booted alone, same run ({slower:.2f} s from spawn to resident)")  # fmt: skip
    run.finish(args.json)


if __name__ == "__main__":
    main()
