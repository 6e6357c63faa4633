#!/usr/bin/env python3
"""The tensor-parallel fast forward on one H200: TP=N equals TP=1 through the Triton kernels, and what the exact
products cost at TP=1.

Run on the GPU machine from the repository root, after `source benchmarks/_h200_setup.sh`:
    python3 benchmarks/tp_fast_h200.py --out $OUT/tp_fast_h200.json          # about 3-4 minutes
Parts:
- `tiny`: the tiny pack prepared at TP=1, 2 and 4 (`tfc fixture tiny`). TP=N's ranks run as threads on the one
  GPU (NCCL takes one GPU per rank, and one is lent), their collectives met in process: each rank's integer words
  summed, each rank's gathers copied, in rank order, with the device synchronised at every meeting. Two sequences
  are prompted and decoded greedily together (2 rows a step); the tokens and the logits' bytes of every world
  (eager) are held to TP=1 built with the world's products (tp_exact), eager and graphed, with the fused stages
  off and on. TP=1's default build (tp_exact off) is reported beside it.
- `cost`: a Flash-geometry slice (`tfc fixture flash-random --layers 4`, the real per-layer shapes): decode steps
  at 1, 4 and 16 rows, context 4k, graphed, with tp_exact off and on (graph replay == eager checked for both);
  and the two products it changes alone (layer 0's wo_b, the MoE), plain against fixed-point words.
"""

from __future__ import annotations

import argparse
import hashlib
import platform
import subprocess
import sys
import threading
import traceback
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import Parts, ensure_tfc

ensure_tfc()

import torch  # noqa: E402

ROWS = (1, 4, 16)
DEV = torch.device("cuda")
RUN = {"device": "cuda"}  # --dry: the tiny part on the CPU (the harness checked without a GPU)
TFC = [sys.executable, "-c", "import sys; from tfc.cli import main; sys.argv[0] = 'tfc'; main()"]
PROMPTS = ((0, 17, 42, 99, 123, 500, 77, 310, 211, 5, 64, 9), (0, 300, 301, 302, 7))
STEPS = 12


def sync() -> None:
    if RUN["device"] == "cuda":
        torch.cuda.synchronize()


class Hub:
    """In-process meeting point of a world's rank threads; one thread runs at a time (turn), so the Triton and
    Inductor compiles a first call makes never race."""

    def __init__(self, world: int) -> None:
        self.world, self.turn = world, threading.Lock()
        self.barrier = threading.Barrier(world, timeout=300)
        self.slots: list = [None] * world

    def meet(self, rank: int, t: torch.Tensor) -> list[torch.Tensor]:
        sync()
        self.slots[rank] = t
        self.turn.release()
        self.barrier.wait()
        self.turn.acquire()
        sync()
        parts = [p.clone() for p in self.slots]
        sync()
        self.turn.release()
        self.barrier.wait()  # nobody reuses its slot before every rank has read them all
        self.turn.acquire()
        return parts


class ThreadComm:
    """The Collectives of one rank thread (runtime/parallel/comm.py's protocol)."""

    def __init__(self, hub: Hub, rank: int) -> None:
        from tfc.runtime.parallel.comm import CommStats

        self.hub, self.world, self.rank, self.stats = hub, hub.world, rank, CommStats()

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        parts = self.hub.meet(self.rank, t)
        total = parts[0]
        for p in parts[1:]:
            total = total + p
        t.copy_(total)
        self.stats.calls += 1
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        self.stats.calls += 1
        return self.hub.meet(self.rank, t.contiguous())


def greedy(runner) -> dict:
    """Both prompts fed, then STEPS greedy tokens each, decoded together; tokens and the logits' digest."""
    from tfc.runtime.worker.step import SequenceStep, StepPlan

    digest, tokens = hashlib.sha256(), [[], []]
    out = runner.execute(StepPlan(tuple(SequenceStep(s, p, 0) for s, p in enumerate(PROMPTS))))
    for step in range(STEPS):
        logits = torch.stack([lg.float().cpu() for lg in out.logits])
        digest.update(logits.numpy().tobytes())
        nxt = logits.argmax(-1).tolist()
        for s, t in enumerate(nxt):
            tokens[s].append(int(t))
        if step + 1 < STEPS:
            plan = tuple(SequenceStep(s, (t,), len(PROMPTS[s]) + step) for s, t in enumerate(nxt))
            out = runner.execute(StepPlan(plan))
    for s in range(len(PROMPTS)):
        runner.release(s)
    return {"tokens": tokens, "logits_sha": digest.hexdigest()}


def prepare_tiny(work: Path) -> dict[int, Path]:
    pack = work / "tiny-pack"
    subprocess.run([*TFC, "fixture", "tiny", str(pack)], check=True, capture_output=True)
    out = {}
    for world in (1, 2, 4):
        done = subprocess.run([*TFC, "prepare", str(pack), "--tp", str(world), "-o", str(work / f"tiny-tp{world}")],
                              check=True, capture_output=True, text=True)  # fmt: skip
        out[world] = Path(done.stdout.strip().splitlines()[-1])
    return out


def solo(image: Path, fuse: bool, tp_exact: bool, graphs: bool) -> dict:
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast.build import build_fast
    from tfc.runtime.options import RuntimeOptions

    booted = boot(image, device=RUN["device"], options=RuntimeOptions(graphs=graphs))
    try:
        runner = build_fast(booted, slots=4, tokens_per_slot=512, fuse=fuse, tp_exact=tp_exact)
        res = greedy(runner)
        res["graphs"] = runner.stats()["graphs"]
        return res
    finally:
        booted.close()


def world_run(image: Path, world: int, fuse: bool) -> dict:
    """Every rank of the image as a thread; rank 0's result (every rank's tokens checked equal)."""
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast.build import build_fast
    from tfc.runtime.options import RuntimeOptions

    hub, results, errors = Hub(world), [None] * world, []

    def rank_main(rank: int) -> None:
        hub.turn.acquire()
        booted = None
        try:
            booted = boot(image, rank=rank, device=RUN["device"], options=RuntimeOptions(graphs=False))
            runner = build_fast(booted, slots=4, tokens_per_slot=512, fuse=fuse, comm=ThreadComm(hub, rank))
            results[rank] = greedy(runner)
            results[rank]["collective_calls"] = runner.forward.shard.comm.stats.calls
        except BaseException:  # one rank failing breaks the others' barrier
            errors.append(f"rank {rank}: {traceback.format_exc()[-2500:]}")
            hub.barrier.abort()
        finally:
            if booted is not None:
                booted.close()
            hub.turn.release()

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))
    threading.stack_size(
        256 << 20
    )  # the compilers a first call runs recurse deeply; a thread's default stack is small
    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    same = all(
        r["tokens"] == results[0]["tokens"] and r["logits_sha"] == results[0]["logits_sha"] for r in results
    )
    return {**results[0], "ranks_agree": same}


def tiny(res: dict, work: Path) -> None:
    images = prepare_tiny(work)
    table = {}
    for fuse in (False, True) if RUN["device"] == "cuda" else (False,):
        exact_eager = solo(images[1], fuse, True, False)
        exact_graphed = solo(images[1], fuse, True, True)
        default = solo(images[1], fuse, False, True)
        row = {"tp1_exact_eager": exact_eager, "tp1_exact_graphed": exact_graphed, "tp1_default_graphed": default,
               "graph_equals_eager": exact_graphed["logits_sha"] == exact_eager["logits_sha"]}  # fmt: skip
        for world in (2, 4):
            got = world_run(images[world], world, fuse)
            row[f"tp{world}"] = got
            row[f"tp{world}_equals_tp1"] = (got["tokens"], got["logits_sha"]) == (
                exact_eager["tokens"], exact_eager["logits_sha"])  # fmt: skip
        row["tp1_default_tokens_equal"] = default["tokens"] == exact_eager["tokens"]
        table["fused" if fuse else "unfused"] = row
    res["tiny"] = table
    if not all(r[f"tp{w}_equals_tp1"] and r["graph_equals_eager"] for r in table.values() for w in (2, 4)):
        raise RuntimeError("TP=N differs from TP=1 (or graphs from eager) on the tiny pack")


def cost(res: dict, work: Path, image: str | None) -> None:
    from decode_h200 import decode_tile, make_image, timed
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.graphs.graph_cache import GraphCache, GraphSettings
    from tfc.runtime.models.dsv41.fast.build import build_fast

    path = Path(image) if image else make_image(work)
    booted = boot(path, device="cuda")
    runners = {}
    for exact in (False, True):
        graphs = booted.graphs if not exact else GraphCache(GraphSettings())
        shell = SimpleNamespace(image=booted.image, arena=booted.arena, graphs=graphs)
        runners[exact] = build_fast(
            shell, slots=16, tokens_per_slot=4096 + 2048, engram=False, tp_exact=exact
        )
    table = {}
    for rows in ROWS:
        row = {}
        for exact, runner in runners.items():
            tile = decode_tile(runner, rows)
            a = runner.launch(tile)[:rows].clone()
            runner.forward.step(tile.key)
            name = "tp_exact" if exact else "default"
            row[f"{name}_graph_equals_eager"] = bool(torch.equal(a, runner.forward.buffers.logits[:rows]))
            row[f"{name}_step_s"] = timed(lambda t=tile, r=runner: r.replay(t.key))
            for s in range(rows):
                runner.kv.release(s)
        row["ratio"] = row["tp_exact_step_s"] / row["default_step_s"]
        table[rows] = row
    res["cost"] = {"image": str(path), "decode": table, "products": products(runners[True])}


def products(runner) -> dict:
    """Layer 0's wo_b and MoE alone: the plain launch against the fixed-point words and their value."""
    f = runner.forward
    lin, tables = f.weights.linear("layers.0.attn.wo_b"), f.weights.experts("layers.0")
    return {rows: product_times(f.ops, f.cfg, lin, tables, rows) for rows in ROWS}


def product_times(ops, cfg, lin, tables, rows: int) -> dict:
    from decode_h200 import timed

    x = torch.randn(rows, lin.k, device=DEV)
    xm = torch.randn(rows, cfg.hidden_size, device=DEV).bfloat16()
    top = cfg.num_experts_per_tok
    ids = torch.stack([torch.randperm(cfg.n_routed_experts, device=DEV)[:top] for _ in range(rows)])
    wts, limit = torch.rand(rows, top, device=DEV) + 0.05, cfg.swiglu_limit
    return {
        "wo_b_plain_s": timed(lambda: ops.linear(x, lin)),
        "wo_b_fixed_s": timed(lambda: ops.fixed_value(ops.rows_fixed(x, lin, lin.k))),
        "moe_plain_s": timed(lambda: ops.moe(xm, ids, wts, tables, limit)),
        "moe_fixed_s": timed(
            lambda: ops.fixed_value(ops.moe_fixed(xm, ids, wts, tables, limit, tables.w1.n))
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--work", default="/tmp/tfcbench/tp")
    ap.add_argument("--image", help="a prepared flash-random slice (else one is made under --work)")
    ap.add_argument("--only", default="", help="comma-separated parts: tiny, cost")
    ap.add_argument("--budget-s", type=float, default=540.0)
    ap.add_argument("--dry", action="store_true", help="the tiny part on the CPU, to check the harness")
    args = ap.parse_args()
    if args.dry:
        RUN["device"], args.only = "cpu", "tiny"
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    res: dict = {"device": torch.cuda.get_device_name() if not args.dry else "cpu (--dry)", "torch": torch.__version__,
                 "python": platform.python_version(), "parts": {}}  # fmt: skip
    parts = Parts(res, Path(args.out), args.budget_s)
    only = {p for p in args.only.split(",") if p}
    for name, fn in (("tiny", lambda: tiny(res, work)), ("cost", lambda: cost(res, work, args.image))):
        if not only or name in only:
            parts(name, fn)
    parts.save()


if __name__ == "__main__":
    main()
