"""Tensor parallelism on the CPU (gloo): boot of a TP=2 image against each rank's own boot, and the cost of the
collectives per step, on the tiny image.

    python benchmarks/parallel_cpu.py --out benchmarks/results/parallel/parallel_cpu.json

Builds the tiny pack, prepares it at TP 1, 2 and 4, then, interleaved `--reps` times:

  boot      `tfc load IMAGE --rank R --json` alone for each rank R of the TP=2 image, and `tfc load IMAGE --json`
            (every rank at once, tfc's launcher); TFC_LAUNCH_T0 is the wall time the command was spawned, so
            resident_s = spawn -> that rank's arena holds its bytes, the whole process counted (python, torch
            import, boot). ratio = world resident_s (the last rank) / the slower rank's resident_s alone.
            Each rank also reports started_s (its command parsed) and, in the world, joined_s (torch imported,
            process group formed, settings agreed).
  steps     `tfc generate IMAGE --json --ignore-eos --max-tokens N` at TP 1, 2, 4: decode tok/s and, at TP=N,
            rank 0's seconds in the forward's collectives and in the control broadcast, per step. Seconds in a
            collective include waiting for the slowest rank (on 2 cores, 4 ranks wait on each other).

and once `collectives`: W gloo processes time each collective a step uses, alone (median of `--iters`):
the fixed-point all-reduce int64 [2, T, D], the all-gather of [T, D] float32 (embedding) and of a
vocabulary part [T, V/W] float32 (head), and the control broadcast of a StepPlan, for D = 256 (tiny) and
4096 (DeepSeek-V4.1-Flash), T = 1 and 16. Every process runs with OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "The model reads the prompt"
ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def tfc(*args: str, env: dict | None = None) -> dict | str:
    r = subprocess.run([sys.executable, "-m", "tfc", *args], capture_output=True, text=True, check=True,
                       env={**os.environ, **ENV, **(env or {})}, cwd=tempfile.gettempdir())  # fmt: skip
    last = r.stdout.strip().splitlines()[-1]
    return json.loads(last) if last.startswith("{") else last


def boot_round(image: str) -> dict:
    solo = []
    for rank in (0, 1):
        out = tfc(
            "load",
            image,
            "--rank",
            str(rank),
            "--json",
            "--device",
            "cpu",
            env={"TFC_LAUNCH_T0": repr(time.time())},
        )
        solo.append({"rank": rank, "started_s": out["started_s"], "resident_s": out["resident_s"],
                     "boot_ms": out["wall_ms"]})  # fmt: skip
    out = tfc("load", image, "--json", "--device", "cpu", env={"TFC_LAUNCH_T0": repr(time.time())})
    world = {"resident_s": out["world_resident_s"], "ranks": out["ranks"]}  # each: started, joined, resident
    slower = max(s["resident_s"] for s in solo)
    return {"solo": solo, "world": world, "ratio": round(world["resident_s"] / slower, 4)}


def step_round(images: dict[int, str], tokens: int) -> dict:
    out = {}
    for world, image in images.items():
        g = tfc("generate", image, "--prompt", PROMPT, "--max-tokens", str(tokens), "--ignore-eos", "--json",
                "--device", "cpu")  # fmt: skip
        row = {"decode_tok_s": g["decode_tok_s"], "token_sha": g["token_sha"]}
        if "tp" in g:
            tp, steps = g["tp"], g["tp"]["steps"]
            row.update(steps=steps, collective_ms_per_step=round(tp["collectives"]["seconds"] / steps * 1e3, 3),
                       calls_per_step=tp["collectives"]["calls"] / steps,
                       bytes_per_step=tp["collectives"]["bytes"] / steps,
                       broadcast_ms_per_step=round(tp["broadcast_s"] / steps * 1e3, 3))  # fmt: skip
        out[world] = row
    return out


def collectives_rank(iters: int) -> None:
    """One rank of the collectives timing (RANK/WORLD_SIZE/MASTER_* set); rank 0 prints the JSON."""
    import torch
    import torch.distributed as dist
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        out = []
        for _ in range(iters):
            dist.barrier()
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return round(statistics.median(out) * 1e6, 1)

    rows = []
    for d, vocab in ((256, 640), (4096, 129280)):
        for t in (1, 16):
            fixed = torch.zeros(2, t, d, dtype=torch.int64)
            rows_f = torch.zeros(t, d)
            vpart = torch.zeros(t, -(-vocab // world))
            gather = [torch.empty_like(rows_f) for _ in range(world)]
            gather_v = [torch.empty_like(vpart) for _ in range(world)]
            plan = StepPlan(tuple(SequenceStep(i, (1,), 100) for i in range(t)))
            rows.append({
                "hidden": d, "tokens": t,
                "all_reduce_fixed_us": timed(lambda fixed=fixed: dist.all_reduce(fixed)),
                "all_gather_embed_us": timed(lambda g=gather, r=rows_f: dist.all_gather(g, r)),
                "all_gather_head_us": timed(lambda g=gather_v, v=vpart: dist.all_gather(g, v)),
                "broadcast_plan_us": timed(lambda p=plan: dist.broadcast_object_list([p], src=0)),
            })  # fmt: skip
    if dist.get_rank() == 0:
        print(json.dumps({"world": world, "rows": rows}))
    dist.destroy_process_group()


def collectives(world: int, iters: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {**os.environ, **ENV, "RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, __file__, "--collectives-rank", "--iters", str(iters)],
                                      env=env, stdout=subprocess.PIPE, text=True))  # fmt: skip
    outs = [p.communicate(timeout=600)[0] for p in procs]
    return json.loads(outs[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/parallel/parallel_cpu.json"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--collectives-rank", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.collectives_rank:
        collectives_rank(args.iters)
        return
    with tempfile.TemporaryDirectory() as tmp:
        tfc("fixture", "tiny", f"{tmp}/pack")
        images = {
            w: tfc("prepare", f"{tmp}/pack", "--tp", str(w), "--store", f"{tmp}/store") for w in (1, 2, 4)
        }
        boots, steps = [], []
        for _ in range(args.reps):
            boots.append(boot_round(images[2]))
            steps.append(step_round(images, args.tokens))
        coll = {w: collectives(w, args.iters) for w in (2, 4)}
    result = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load": os.getloadavg()},
        "boot_tp2": boots,
        "boot_ratio_median": statistics.median(b["ratio"] for b in boots),
        "steps": steps,
        "collectives": coll,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({"boot_ratio_median": result["boot_ratio_median"], "out": str(args.out)}))


if __name__ == "__main__":
    main()
