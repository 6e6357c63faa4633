#!/usr/bin/env python3
"""The fast forward on an H200: decode steps against their byte floor, prefill against the bf16 peak, on a
Flash-geometry slice (`tfc fixture flash-random --layers 4`, 22 GB: the real per-layer shapes and widths).

Run on the GPU machine from the repository root, after `source benchmarks/_h200_setup.sh`:
    python3 benchmarks/decode_h200.py --out $OUT/decode_h200.json            # about 5-7 minutes
Without --image it writes the pack and prepares it under --work first (~35 s, 44 GB of disk at the peak).
Order: the HBM copy rate and the bf16 tensor-core peak; checks, which must pass before anything is timed
(graph replay == eager bit for bit at 1, 4 and 16 rows; every layer's streams and the logits of 4 tokens
against the reference forward on the same weights decoded on the device); decode steps at 1, 4 and 16 rows,
context 4k, graphed, with the pinned (exact) launches and with each shape's own launches; the projection to
the whole model; verify windows (1-6 consecutive rows of one sequence, the draft-verify step of issue #24)
against the 1-row step; the DSpark drafter's round (observe, then 5 drafts; the slice's one block and three, as
Flash has) and the whole-Flash tok/s it projects with drafting at the published acceptance; prefill of 2k and
16k-token prompts. `--only decode,verify,drafter` runs those parts after the checks. The JSON is rewritten after
every part.

Byte floor of a step: every byte it must read once at the copy rate: each layer's non-expert segments
(attention EXL3 groups, norms, mHC, router, indexer), the distinct experts its live rows picked (trellis and
scales) and the shared expert, the KV rows its live rows read (window, selected entries, the index keys of
the context), the head. Whole-Flash projection (TP=1, context 4k): each of the 40 layers' floor from the
slice's layer of the same mode (reuse = swa's segments; reindex = swa's plus the indexer's), divided by the
efficiency (floor / measured) the slice's layers reached, plus the measured head.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import Parts, ensure_tfc

ensure_tfc()

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROWS = (1, 4, 16)
VERIFY = (1, 2, 3, 4, 5, 6)  # rows of a DSpark verify window: the last token and up to 5 drafts
CONTEXT = 4096
PREFILL = (2048, 16384)
REFS = {"analytic_limit_gb_per_token": 7.5, "analytic_limit_tok_s": 570, "tensorfold_2x_gb10_decode_tok_s": 90,
        "tensorfold_2x_gb10_prefill_tok_s": 2686}  # fmt: skip
DEV = torch.device("cuda")
BUILD: dict = {}  # extra build_fast options (the --dry run's small buckets)


def timed(fn, reps: int = 20, warm: int = 3) -> float:
    """Median seconds of fn between CUDA events."""
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(out)


def sync() -> None:
    torch.cuda.synchronize()


def graphed(fn):
    """fn captured once (after a warm-up): a replay callable."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def copy_gbps() -> float:
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    return 2 * n / timed(lambda: dst.copy_(src), reps=30) / 1e9


def bf16_tflops() -> float:
    a, b = (torch.randn(8192, 8192, device=DEV, dtype=torch.bfloat16) for _ in range(2))
    return 2 * 8192**3 / timed(graphed(lambda: a @ b), reps=20) / 1e12


def make_image(work: Path) -> Path:
    tfc = [sys.executable, "-c", "import sys; from tfc.cli import main; sys.argv[0] = 'tfc'; main()"]
    pack, store = work / "pack", work / "store"
    subprocess.run([*tfc, "fixture", "flash-random", str(pack), "--layers", "4", "-j", "16"], check=True)
    subprocess.run([*tfc, "prepare", str(pack), "-o", str(store)], check=True)
    subprocess.run(["rm", "-rf", str(pack)], check=True)
    return next(p for p in store.iterdir() if p.is_dir() and not p.name.startswith("."))


def decode_tile(runner, rows: int, position: int | None = None):
    from tfc.runtime.models.dsv41.fast.step_plan import TileRow, make_tile

    position = CONTEXT - 1 if position is None else position
    for s in range(rows):
        runner.kv.ensure(s, position + 1)
    live = [TileRow(s, (7919 * s + 11) % runner.info.vocab_size, position) for s in range(rows)]
    return make_tile(live, runner.kv.dummy_slot, runner.buckets)


def segment_bytes(weights, prefix: str, skip: tuple[str, ...] = (".ffn.experts.", ".engram.rows")) -> int:
    return sum(s.length for s in weights.image.manifest.segments
               if s.name.startswith(prefix) and not any(k in s.name for k in skip))  # fmt: skip


def expert_bytes(tables, entries) -> int:
    """Trellis and scales of these table entries over the three projections."""
    scales = sum(2 * (t.k + t.n) for t in (tables.w1, tables.w3, tables.w2))
    return sum(tables.entry_bytes(e) + scales for e in entries)


def kv_bytes(cfg, mode, context: int) -> int:
    """KV bytes one row reads in a layer of this mode at `context` tokens."""
    n = cfg.sliding_window * (cfg.head_dim + cfg.head_dim // 32)
    if mode.compress_ratio:
        visible = context // mode.compress_ratio
        n += min(cfg.index_topk, visible) * (cfg.head_dim // 2 + cfg.head_dim // 16)
        if mode.is_index_source:
            n += visible * (cfg.index_head_dim // 2 + cfg.index_head_dim // 32)
    return n


def routes_of(runner, tile) -> dict[int, list[int]]:
    """The distinct experts each layer's live rows pick in this step (one eager run)."""
    runner.forward.routes = []
    runner.forward.buffers.load(tile, None)
    runner.forward.step(tile.key)
    got = {layer: sorted(set(ids.flatten().tolist())) for layer, ids in runner.forward.routes}
    runner.forward.routes = None
    return got


class Floor:
    """Byte floors of the slice's steps and of the whole Flash model's."""

    def __init__(self, runner, flash_cfg) -> None:
        self.r, self.w, self.cfg, self.flash = runner, runner.forward.weights, runner.forward.cfg, flash_cfg
        self.static = {
            layer: segment_bytes(self.w, f"layers.{layer}.") for layer in range(self.cfg.num_hidden_layers)
        }
        self.head = segment_bytes(self.w, "head.") + segment_bytes(self.w, "norm.weight")
        indexer = segment_bytes(self.w, "layers.2.attn.indexer.wq_b") + segment_bytes(
            self.w, "layers.2.attn.indexer.weights_proj"
        )
        swa = (self.static[0] + self.static[1]) // 2
        ratio_layer = {m.compress_ratio: m.layer for m in self.cfg.modes if m.mode == "full"}
        self.by_mode = {"swa": lambda m: swa, "reuse": lambda m: swa, "reindex": lambda m: swa + indexer,
                        "full": lambda m: self.static[ratio_layer.get(m.compress_ratio, 2)]}  # fmt: skip

    def slice_layers(self, routes: dict[int, list[int]], rows: int) -> int:
        out = 0
        for layer, picked in routes.items():
            tables = self.w.experts(f"layers.{layer}")
            out += self.static[layer] + expert_bytes(tables, [*picked, tables.w1.entries - 1])
            out += rows * kv_bytes(self.cfg, self.cfg.layer_mode(layer), CONTEXT)
        return out

    def flash_layers(self, routes: dict[int, list[int]], rows: int) -> int:
        per_expert = statistics.mean(expert_bytes(self.w.experts(f"layers.{layer}"), picked) / max(len(picked), 1)
                                     for layer, picked in routes.items())  # fmt: skip
        distinct = statistics.mean(len(p) for p in routes.values())
        shared = statistics.mean(expert_bytes(self.w.experts(f"layers.{layer}"), [self.w.experts(f"layers.{layer}").w1.entries - 1])
                                 for layer in routes)  # fmt: skip
        return int(sum(self.by_mode[m.mode](m) + distinct * per_expert + shared + rows * kv_bytes(self.flash, m, CONTEXT)
                       for m in self.flash.modes))  # fmt: skip


def flash_config():
    from tfc.fixtures.flash_headers import flash_config as raw
    from tfc.packs.deepseek_v41_config import config_from_dict as pack_config
    from tfc.runtime.models.dsv41.config import config_from_dict

    return config_from_dict(raw(), pack_config(raw()).layer_mode_records())


def reference_weights(runner):
    """The reference's weights: the slice's own, decoded on the device."""
    from support.dense_check import DeviceDense

    return DeviceDense(runner.forward.weights)


def check_layers(runner, loose) -> dict:
    """The slice's streams per layer and logits of 8 tokens against the reference on device-decoded weights."""
    from support.dense_check import agreement

    vocab = runner.info.vocab_size
    toks = [t % vocab for t in (0, 17, 4242, 99, 123, 5000, 77, 31000)]
    res = agreement(runner, loose, toks, reference_weights(runner))
    if DEV.type == "cuda":
        torch.cuda.empty_cache()
    # outside the agreement bound (dense_check.agreement) something is wrong, and nothing is timed
    res["blocking"] = not res["pass"]
    return res


def run(args) -> None:
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.graphs.graph_cache import GraphCache, GraphSettings
    from tfc.runtime.models.dsv41.fast.build import build_fast

    res: dict = {"device": torch.cuda.get_device_name() if DEV.type == "cuda" else "cpu (--dry)", "torch": torch.__version__, "python": platform.python_version(),
                 "references": REFS, "parts": {}}  # fmt: skip
    parts = Parts(res, Path(args.out), args.budget_s)
    save, only = parts.save, {name for name in args.only.split(",") if name}

    def part(name: str, fn) -> None:
        if only and name not in only | {"image", "rates", "checks"}:
            res["parts"][name] = "skipped: --only"
        else:
            parts(name, fn)

    image = Path(args.image) if args.image else None
    if image is None:
        part("image", lambda: res.__setitem__("image", str(make_image(Path(args.work)))))
        image = Path(res["image"])
    booted = boot(image, device=DEV.type)
    runner = build_fast(booted, slots=16, tokens_per_slot=max(PREFILL) + 2048, engram=False, **BUILD)
    loose_graphs = GraphCache(GraphSettings())  # a cache of its own: same keys, other steps
    loose = build_fast(SimpleNamespace(image=booted.image, arena=booted.arena, graphs=loose_graphs), slots=16,
                       tokens_per_slot=CONTEXT + 2048, exact=False, engram=False, **BUILD)  # fmt: skip
    res["image_bytes"], res["layers"] = booted.arena.nbytes, runner.forward.cfg.num_hidden_layers
    res["kv"] = runner.stats()["kv"]
    part("rates", lambda: res.update(copy_gbps=copy_gbps(), bf16_tflops=bf16_tflops()))

    def checks() -> None:
        eq = {}
        for rows in ROWS:
            tile = decode_tile(runner, rows)
            a = runner.launch(tile)[:rows].clone()
            runner.forward.step(tile.key)  # eager, same static inputs (every write is idempotent)
            eq[rows] = bool(torch.equal(a, runner.forward.buffers.logits[:rows]))
        ref = (
            {"skipped": "--no-reference", "pass": True, "blocking": False}
            if args.no_reference
            else check_layers(runner, loose)
        )
        res["checks"] = {"graph_equals_eager": eq, "reference": ref}
        if not ref["pass"]:  # where the difference comes from: each kernel call alone
            from support.dense_check import kernel_errors

            res["checks"]["kernel_errors"] = {f"L{layer} {k}": v for layer in (0, 2)
                                              for k, v in kernel_errors(runner, layer).items()}  # fmt: skip
        if not all(eq.values()) or (res["checks"]["reference"]["blocking"] and not args.time_anyway):
            raise RuntimeError(f"checks failed: {res['checks']}")

    part("checks", checks)
    if not res.get("checks") or "failed" in res["parts"]["checks"]:
        return
    floor = Floor(runner, flash_config())
    head = {}

    def decode() -> None:
        lin = runner.forward.weights.linear("head")
        for rows in ROWS:  # as a step hands it: 16 rows, these live
            x = torch.randn(16, lin.k, device=DEV)
            live = rows if rows < 16 else None
            head[rows] = timed(graphed(lambda x=x, live=live: runner.forward.ops.linear(x, lin, live)))
        rate = res["copy_gbps"] * 1e9
        table = {}
        for rows in ROWS:
            tile = decode_tile(runner, rows)
            routes = routes_of(runner, tile)
            runner.launch(tile)
            step = timed(lambda t=tile: runner.replay(t.key))
            with_inputs = timed(lambda t=tile: runner.launch(t))
            lt = decode_tile(loose, rows)
            loose.launch(lt)
            step_loose = timed(lambda t=lt: loose.replay(t.key))
            layers_floor = floor.slice_layers(routes, rows)
            floor_s = (layers_floor + floor.head) / rate
            flash_layers = floor.flash_layers(routes, rows)
            eff = (layers_floor / rate) / max(step - head[rows], 1e-9)
            flash_step = flash_layers / rate / eff + head[rows]
            table[rows] = {"step_s": step, "step_with_inputs_s": with_inputs, "step_unpinned_s": step_loose,
                           "head_s": head[rows], "per_layer_s": (step - head[rows]) / res["layers"],
                           "floor_bytes": layers_floor + floor.head, "floor_s": floor_s, "floor_ratio": floor_s / step,
                           "distinct_experts_per_layer": statistics.mean(len(p) for p in routes.values()),
                           "flash_floor_bytes": flash_layers + floor.head, "flash_step_s": flash_step,
                           "flash_tok_s": rows / flash_step, "flash_floor_tok_s": rows * rate / (flash_layers + floor.head)}  # fmt: skip
            for s in range(rows):
                runner.kv.release(s)
                loose.kv.release(s)
        res["decode"] = table

    part("decode", decode)

    def verify() -> None:
        """A draft-verify window: w consecutive rows of one sequence at context 4k, graphed, against w = 1."""
        from tfc.runtime.models.dsv41.fast.step_plan import TileRow, make_tile

        table = {}
        for w in VERIFY:
            runner.kv.ensure(0, CONTEXT + w)
            rows = [TileRow(0, (7919 * i + 11) % runner.info.vocab_size, CONTEXT - 1 + i) for i in range(w)]
            tile = make_tile(rows, runner.kv.dummy_slot, runner.buckets)
            runner.launch(tile)
            table[w] = {"step_s": timed(lambda t=tile: runner.replay(t.key))}
        one = table[VERIFY[0]]["step_s"]
        for w, row in table.items():
            row["vs_one_row"] = row["step_s"] / one
            row["per_extra_row_s"] = (row["step_s"] - one) / max(1, w - 1)
        runner.kv.release(0)
        res["verify"] = table

    part("verify", verify)

    def drafter() -> None:
        """The DSpark drafter's round at context 4k, one sequence (as the engine drafts): the slot's committed rows
        observed (1 or 4 a round), then a block of 5 drafts; with the slice's blocks, and with its first block as
        many times as Flash has blocks (three, of the same shapes), graphed (as the runner drafts on a GPU) and
        eager. Wall time, the host's syncs included; each variant's drafts checked against the first's."""
        from tfc.runtime.models.dsv41.dspark.fast import FastDsparkDrafter
        from tfc.runtime.worker.step import SequenceStep, StepPlan

        if runner.drafter is None:
            raise RuntimeError(f"no drafter: {runner.draft_note}")
        slots, vocab = runner.drafter, runner.info.vocab_size
        single = slots.drafter
        graphs = runner.graphs.enabled
        flash_blocks = flash_config().num_nextn_predict_layers  # 3
        variants = {f"{len(single.blocks)}_{'graphed' if graphs else 'eager'}": single}
        for graphed_ in (graphs, False):
            as_flash = FastDsparkDrafter(runner.forward, runner.graphs if graphed_ else None)
            as_flash.blocks = (single.blocks * flash_blocks)[:flash_blocks]
            variants.setdefault(f"{flash_blocks}_{'graphed' if graphed_ else 'eager'}", as_flash)
        toks = np.random.default_rng(5).integers(0, vocab, CONTEXT).tolist()
        table, drafts = {}, {}
        for name, drafter_ in variants.items():
            slots.drafter = drafter_
            runner.release(0)
            runner.execute(StepPlan((SequenceStep(0, tuple(toks), 0, drafting=True),)))
            sync()
            started = time.perf_counter()
            runner.draft(0, 11, 5)  # observes the prompt's last window of rows (graphed: captures)
            sync()
            row, got = {"first_draft_s": time.perf_counter() - started}, []
            position = CONTEXT
            for commit in (1, 4):
                times = []
                for _ in range(12):
                    fed = [(7919 * (position + i) + 11) % vocab for i in range(commit)]
                    runner.execute(StepPlan((SequenceStep(0, tuple(fed), position, drafting=True),)))
                    position += commit
                    sync()
                    started = time.perf_counter()
                    got.append(runner.draft(0, fed[-1], 5))
                    sync()
                    times.append(time.perf_counter() - started)
                    assert len(got[-1]) == 5, got[-1]
                row[f"round_s_commit_{commit}"] = statistics.median(times[2:])
            blocks = name.split("_")[0]
            row["drafts_equal_graphed"] = drafts.setdefault(blocks, got) == got
            table[name] = row
        slots.drafter = single
        runner.release(0)
        res["drafter"] = table
        one = res.get("decode", {}).get(1, {})
        if one and res.get("verify"):  # whole Flash: a round = the 3-block drafter + a 6-row verify window
            draft_s = table[f"{flash_blocks}_{'graphed' if graphs else 'eager'}"]["round_s_commit_4"]
            verify_s = one["flash_step_s"] * res["verify"][6]["vs_one_row"]
            res["drafting_projection"] = {
                "serial_tok_s": 1 / one["flash_step_s"], "flash_drafter_round_s": draft_s,
                "flash_verify_6_rows_s": verify_s,
                **{f"tok_s_at_{tau}_tokens_a_round": tau / (draft_s + verify_s) for tau in (1.7, 3.7)},
                "tensorfold_2x_gb10_decode_tok_s": REFS["tensorfold_2x_gb10_decode_tok_s"],
                "note": "tokens a round = emitted per draft-verify round (the bonus token included), the published "
                        "acceptance; random weights cannot measure acceptance",
            }  # fmt: skip

    part("drafter", drafter)

    def prefill() -> None:
        from tfc.runtime.worker.step import SequenceStep, StepPlan

        rate, cfg = res["copy_gbps"] * 1e9, runner.forward.cfg
        table = {}
        for n in PREFILL if not args.quick else PREFILL[:1]:
            toks = np.random.default_rng(n).integers(0, cfg.vocab_size, n).tolist()
            plan = StepPlan((SequenceStep(14, tuple(toks), 0),))
            runner.execute(plan)  # captures the (16, context) keys it meets
            runner.release(14)
            sync()
            started = time.perf_counter()
            runner.execute(plan)
            sync()
            wall = time.perf_counter() - started
            runner.release(14)
            tiles = -(-n // 16)
            routes = routes_of(runner, decode_tile(runner, 16, position=n // 2))
            ratio = floor.flash_layers(routes, 16) / floor.slice_layers(routes, 16)
            flash_s = (wall - tiles * head[16]) * ratio + tiles * head[16]
            flops = 2 * active_params(runner, flash_config())
            table[n] = {"wall_s": wall, "tok_s": n / wall, "flash_tok_s": n / flash_s,
                        "flash_flop_per_token": flops, "flash_tflops": flops * n / flash_s / 1e12,
                        "peak_fraction": flops * n / flash_s / 1e12 / res["bf16_tflops"],
                        "floor_ratio_16_rows": floor.slice_layers(routes, 16) / rate * tiles / (wall - tiles * head[16])}  # fmt: skip
            for s in range(16):
                runner.kv.release(s)
        res["prefill"] = table

    part("prefill", prefill)
    stats = runner.stats()
    res["graphs"], res["notes"] = stats["graphs"], stats["notes"]
    save()


def active_params(runner, flash, head: bool = True) -> int:
    """Weights one token multiplies in the model of config `flash` (the whole Flash model, or the slice's own):
    attention groups by mode, 7 experts, router, and the head unless `head` is False."""
    w, cfg = runner.forward.weights, runner.forward.cfg

    def groups(prefix: str) -> int:
        return sum(int(np.prod(s.shape[:2])) * 256 for s in w.image.manifest.segments
                   if s.name.startswith(prefix) and s.name.endswith(".trellis") and ".experts." not in s.name)  # fmt: skip

    swa = groups("layers.0.attn.")
    by = {
        "swa": swa,
        "reuse": swa,
        "reindex": swa + groups("layers.2.attn.indexer.wq_b"),
        "full": groups("layers.2.attn."),
    }
    expert = 3 * cfg.hidden_size * cfg.moe_intermediate_size * (cfg.num_experts_per_tok + 1)
    router = cfg.n_routed_experts * cfg.hidden_size
    return sum(by[m.mode] + expert + router for m in flash.modes) + (groups("head.") if head else 0)


def _dry() -> None:
    """A CPU smoke of every part on the tiny image: the kernels' torch references, host timers, small sizes."""

    def host_timed(fn, reps: int = 3, warm: int = 1) -> float:
        for _ in range(warm):
            fn()
        out = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
        return statistics.median(out)

    def dense(runner):
        from tfc.runtime.models.dsv41.reference.weights import load_dense_weights

        return load_dense_weights(runner.forward.weights.image.path)[1]

    torch.set_num_threads(1)
    globals().update(DEV=torch.device("cpu"), timed=host_timed, graphed=lambda fn: fn, sync=lambda: None,
                     CONTEXT=256, PREFILL=(48, 96), BUILD={"context_step": 256, "page_tokens": 64},
                     reference_weights=dense, bf16_tflops=lambda: 1.0)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument(
        "--image", help="a prepared flash-random --layers 4 image (default: make one under --work)"
    )
    ap.add_argument("--work", default="/tmp/tfcbench/decode", help="where to make the image")
    ap.add_argument(
        "--budget-s", type=float, default=420, help="parts starting after this many seconds are skipped"
    )
    ap.add_argument("--quick", action="store_true", help="prefill of 2k tokens only")
    ap.add_argument("--only", default="", help="comma-separated parts to run after the checks (default: all), "
                    "e.g. decode,verify,drafter")  # fmt: skip
    ap.add_argument("--time-anyway", action="store_true",
                    help="time even when the reference check is off by more than 0.1 (graph == eager must hold)")  # fmt: skip
    ap.add_argument("--no-reference", action="store_true",
                    help="checks: graph == eager only (the agreement with the dense reference is test_fast_gpu's)")  # fmt: skip
    ap.add_argument(
        "--dry", action="store_true", help="CPU smoke on --image (the tiny image): no GPU, small sizes"
    )
    args = ap.parse_args()
    if args.dry:
        _dry()
    run(args)


if __name__ == "__main__":
    main()
