#!/usr/bin/env python3
"""The fast forward's decode step on a Flash-geometry slice against its byte floor, the kernels a layer launches,
and the whole-Flash decode rate it projects.

    python benchmarks/decode.py [--image IMG/rank0] [--rows 1,4,16,64,256] [--json]      # a few minutes on a GPU
    python benchmarks/decode.py --device cpu --image TINY/rank0                          # a smoke of the script
    python benchmarks/decode.py --host-experts PACK --against DECODE.json [--json]      # whole Flash on one GPU

IMG is `tfc fixture flash-random --layers 4` prepared (22 GB: the real per-layer shapes and expert widths);
without --image one is made under --work first (~1 min, 44 GB of disk at the peak). Measured in the same run: the
device's memory copy rate. Each row count's step runs graphed at a 4k context, median of 30 replays, after graph
replay == eager was checked bit for bit. Row counts beyond what a step holds are reported as such.

Byte floor of a step: every byte it must read once, at the copy rate: each layer's non-expert segments (attention
groups, norms, mHC, router, indexer), the distinct experts its live rows picked (trellis and scales) and the
shared expert, the KV rows its rows read (window, selected entries, the index keys of the context), the head.
Whole-Flash projection (TP=1, 4k context): each of Flash's layers' floor from the slice's layer of the same mode,
over the efficiency (floor / time) the slice's layers reached, plus the measured head. Kernels a layer: the CUDA
kernels of an eager one-row step (torch.profiler) over the slice's layers; the widest step's kernels are profiled
too. On the CPU (`--device cpu`, the tiny image) everything runs on the kernels' torch references at small sizes:
a check of the script, no figure.

--host-experts PACK: whole Flash on one H200 keeps the routed experts of 13 of its 40 layers in pinned host memory
(`tfc plan --gpu-memory-gib 141 --tp 1`, benchmarks/results/plan/flash_tp1_h200.json), where the MoE kernels read
the picked experts over PCIe. The slice's pack is prepared for the GPU budget that moves one of its 4 layers'
experts to host memory (about the plan's fraction), and its step at 1 and 16 rows is timed against --against, the
all-HBM run of the same pack in the same call, whose logits it must match bit for bit. Whole Flash on one GPU: that
run's whole-Flash step plus 13 times the step time one cold layer adds here.

One script for the decode topic (the project keeps one a topic), so it runs past 400 lines: the step, its kernels
and the host-experts projection share the slice, the floor and the whole-Flash projection.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c

CONTEXT = {"cuda": 4096, "cpu": 256}
ONE_H200_PLAN = Path(__file__).resolve().parent / "results" / "plan" / "flash_tp1_h200.json"
PEERS = "~570 tok/s one-H200 bandwidth bound; vLLM 123 (4x RTX PRO 6000), SGLang ~590 (V4-Flash, 4x H200)"


# -- the image and its runner ---------------------------------------------------------------------------------


def open_image(args, work: Path | None = None) -> Path:
    """--image, or a slice made under --work (a temporary folder by default)."""
    if args.image:
        return Path(args.image)
    folder = Path(args.work) if args.work else Path(work or tempfile.mkdtemp(prefix="tfc-slice-"))
    print(
        f"making the Flash slice under {folder} (tfc fixture flash-random --layers 4, tfc prepare)",
        flush=True,
    )
    return c.slice_image(folder)


def build(image: Path, device: str, tokens: int, prefill_rows: int = 0, slots: int = 16):
    """The fast runner over a booted image, its Triton kernels cached in the image store as `tfc serve` keeps
    them; Engram off: the slices have no Engram layer."""
    from tfc.runtime.boot.kernel_cache import use_store_cache
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.models.dsv41.fast.build import build_fast

    booted = boot(image, device=device)
    use_store_cache(booted.image.path, device)
    small = {} if device == "cuda" else {"context_step": 256, "page_tokens": 64}
    return build_fast(
        booted,
        slots=slots,
        tokens_per_slot=tokens,
        kv_tokens=slots * tokens,
        engram=False,
        prefill_rows=prefill_rows,
        **small,
    )


def max_step_rows() -> int:
    from tfc.runtime.models.dsv41.fast.graph_keys import MAX_ROWS

    return MAX_ROWS


def decode_tile(runner, rows: int, position: int):
    """A step of `rows` sequences (slots 0..rows-1) each at `position`."""
    from tfc.runtime.models.dsv41.fast.step_plan import TileRow, make_tile

    for s in range(rows):
        runner.kv.ensure(s, position + 1)
    live = [TileRow(s, (7919 * s + 11) % runner.info.vocab_size, position) for s in range(rows)]
    return make_tile(live, runner.kv.dummy_slot, runner.buckets)


def routes_of(runner, tile) -> dict[int, list[int]]:
    """The distinct experts each layer's live rows pick in this step (one eager run)."""
    runner.forward.routes = []
    runner.forward.buffers.load(tile, None)
    runner.forward.step(tile.key)
    got = {layer: sorted(set(ids.flatten().tolist())) for layer, ids in runner.forward.routes}
    runner.forward.routes = None
    return got


# -- the byte floor and the whole-Flash projection -------------------------------------------------------------


def flash_config():
    """DeepSeek-V4.1-Flash's config as the runtime reads it (from the full-scale header fixture's)."""
    from tfc.fixtures.flash_headers import flash_config as raw
    from tfc.packs.deepseek_v41_config import config_from_dict as pack_config
    from tfc.runtime.models.dsv41.config import config_from_dict

    return config_from_dict(raw(), pack_config(raw()).layer_mode_records())


def image_config(image: Path):
    """An image's model config, from its manifest (no weights read)."""
    from tfc.cache.format import RankManifest
    from tfc.runtime.models.dsv41.config import config_from_dict

    m = RankManifest.load(image)
    meta = m.meta or {}
    return m, config_from_dict(meta.get("pack_config") or {}, meta.get("layer_modes"), str(image))


def segment_bytes(segments, prefix: str, skip: tuple[str, ...] = (".ffn.experts.", ".engram.rows")) -> int:
    return sum(s.length for s in segments if s.name.startswith(prefix) and not any(k in s.name for k in skip))


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


class Floor:
    """Byte floors of the slice's steps and of the whole Flash model's."""

    def __init__(self, runner, flash_cfg, context: int) -> None:
        self.w, self.cfg, self.flash, self.context = (
            runner.forward.weights,
            runner.forward.cfg,
            flash_cfg,
            context,
        )
        segs = self.w.image.manifest.segments
        self.static = {
            layer: segment_bytes(segs, f"layers.{layer}.") for layer in range(self.cfg.num_hidden_layers)
        }
        self.head = segment_bytes(segs, "head.") + segment_bytes(segs, "norm.weight")
        indexer = segment_bytes(segs, "layers.2.attn.indexer.wq_b") + segment_bytes(
            segs, "layers.2.attn.indexer.weights_proj"
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
            out += rows * kv_bytes(self.cfg, self.cfg.layer_mode(layer), self.context)
        return out

    def flash_layers(self, routes: dict[int, list[int]], rows: int) -> int:
        per_expert = statistics.mean(expert_bytes(self.w.experts(f"layers.{layer}"), picked) / max(len(picked), 1)
                                     for layer, picked in routes.items())  # fmt: skip
        distinct = statistics.mean(len(p) for p in routes.values())
        shared = statistics.mean(expert_bytes(self.w.experts(f"layers.{layer}"),
                                              [self.w.experts(f"layers.{layer}").w1.entries - 1]) for layer in routes)  # fmt: skip
        return int(sum(self.by_mode[m.mode](m) + distinct * per_expert + shared
                       + rows * kv_bytes(self.flash, m, self.context) for m in self.flash.modes))  # fmt: skip


def active_params(segments, cfg, model, head: bool = True) -> int:
    """Weights one token multiplies in `model` (Flash's config, or the slice's own), measured on the slice's
    segments: attention groups by layer mode, 7 experts and the router a layer, and the head unless not `head`."""

    def groups(prefix: str) -> int:
        return sum(int(s.shape[0]) * int(s.shape[1]) * 256 for s in segments
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
    return sum(by[m.mode] + expert + router for m in model.modes) + (groups("head.") if head else 0)


# -- the parts ---------------------------------------------------------------------------------------------------


def head_time(runner, device: str, rows: int) -> float:
    """The head alone as a step runs it (whole 16-row chunks handed, `rows` live), graphed."""
    import torch
    from tfc.runtime.models.dsv41.fast.graph_keys import chunked_rows

    lin = runner.forward.weights.linear("head")
    x = torch.randn(chunked_rows(rows), lin.k, device=device)
    live = rows if rows < x.shape[0] else None
    return c.timed(device, c.graphed(lambda: runner.forward.ops.linear(x, lin, live), device))


def step_times(runner, device: str, rows_list, context: int, copy: float) -> dict:
    """Each row count's graphed step against its floor, and the whole-Flash projection."""
    import torch

    floor = Floor(runner, flash_config(), context)
    rate = copy * 1e9
    table: dict = {}
    for rows in rows_list:
        if rows > max_step_rows():
            table[rows] = f"not run: a step of this runner holds at most {max_step_rows()} rows"
            continue
        tile = decode_tile(runner, rows, context - 1)
        routes = routes_of(runner, tile)
        logits = runner.launch(tile)[:rows].clone()
        runner.forward.step(tile.key)  # eager on the same inputs: every write is idempotent
        if not torch.equal(logits, runner.forward.buffers.logits[:rows]):
            raise RuntimeError(f"graph replay differs from eager at {rows} rows: nothing is timed")
        step = c.timed(device, lambda t=tile: runner.replay(t.key), reps=30 if device == "cuda" else 3)
        head = head_time(runner, device, rows)
        layers_floor = floor.slice_layers(routes, rows)
        floor_s = (layers_floor + floor.head) / rate
        eff = (layers_floor / rate) / max(step - head, 1e-9)
        flash_layers = floor.flash_layers(routes, rows)
        flash_step = flash_layers / rate / eff + head
        digest = hashlib.sha256(logits.float().cpu().numpy().tobytes()).hexdigest()
        table[rows] = {"step_s": step, "head_s": head, "logits_sha256": digest, "floor_s": floor_s, "floor_ratio": floor_s / step,
                       "floor_bytes": layers_floor + floor.head,
                       "distinct_experts_per_layer": statistics.mean(len(p) for p in routes.values()),
                       "flash_step_s": flash_step, "flash_tok_s": rows / flash_step,
                       "flash_floor_tok_s": rows * rate / (flash_layers + floor.head)}  # fmt: skip
        for s in range(rows):
            runner.kv.release(s)
        print(f"[decode] {rows} rows: {step * 1e6:,.1f} µs against a floor of {floor_s * 1e6:,.1f} µs "
              f"({floor_s / step:.1%}); whole Flash {rows / flash_step:,.1f} tok/s projected", flush=True)  # fmt: skip
    return table


def kernels_a_step(runner, device: str, context: int, rows: int = 1) -> dict:
    """Kernels and GPU time of an eager step of `rows` rows (torch.profiler over 5 steps), the top 30 by GPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    tile = decode_tile(runner, rows, context - 1)
    runner.forward.buffers.load(tile, None)
    for _ in range(3):
        runner.forward.step(tile.key)
    torch.cuda.synchronize()
    steps = 5
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(steps):
            runner.forward.step(tile.key)
        torch.cuda.synchronize()
    for s in range(rows):
        runner.kv.release(s)
    events = sorted(
        (e for e in p.key_averages() if e.device_time_total > 0), key=lambda e: -e.device_time_total
    )
    return {"kernels_per_step": sum(e.count for e in events) / steps,
            "gpu_us_per_step": sum(e.device_time_total for e in events) / steps,
            "top": [{"name": e.key[:100], "us_per_step": e.device_time_total / steps, "calls": e.count / steps}
                    for e in events[:30]]}  # fmt: skip


# -- whole Flash on one GPU: cold experts in host memory --------------------------------------------------------


def one_cold_layer_gib(pack: Path, context: int, seqs: int) -> float:
    """The GPU budget (GiB) at which `tfc prepare` moves exactly one layer's routed experts of the pack to host
    memory: every device byte but that layer's experts (the one placement.spread picks first) and the Engram rows,
    plus the plan's KV and overhead reserve, plus half that layer's experts."""
    import json

    from tfc.compiler.placement import GIB, spread

    target = ["--max-context", str(context), "--max-seqs", str(seqs), "--json"]
    roomy = json.loads(c.tfc("plan", str(pack), "--gpu-memory-gib", "100000", *target))
    rank, placed = roomy["ranks"][0], roomy["placement"]
    layers = [r for r in rank["layers"] if r["bytes"].get("routed_trellis")]
    cold = spread([r["layer"] for r in layers], 1)[0]
    moved = next(r["bytes"]["routed_trellis"] for r in layers if r["layer"] == cold)
    # the Engram rows leave the device as soon as any layer's experts do
    engram = sum(r["bytes"].get("engram_rows", 0) for r in rank["layers"])
    need = rank["tiers"]["device"] - moved - engram + placed["kv_bytes"] + placed["overhead_bytes"]
    return (need + (moved // 2)) / GIB  # halfway: one layer must leave, a second need not


def cold_layers_of(image: Path) -> list[int]:
    """The layers whose routed experts the image keeps in host memory."""
    from tfc.cache.format import RankManifest

    return sorted({int(s.name.split(".")[1]) for s in RankManifest.load(image).segments
                   if ".ffn.experts." in s.name and s.tier == "host"})  # fmt: skip


def all_hbm_problem(against: Path) -> str | None:
    """Why a decode result cannot stand as the all-HBM run (None when it can): it must hold the 1- and 16-row
    steps with their logits digests."""
    import json

    try:
        table = json.loads(against.read_text())["data"]["decode"]
    except (OSError, ValueError, KeyError, TypeError):
        return "not a decode.py --json result"
    if not all(isinstance(table.get(r), dict) and "logits_sha256" in table[r] for r in ("1", "16")):
        return "it lacks the 1- and 16-row steps with their logits digests (rerun decode.py with --rows 1,16,...)"
    return None


def host_experts(run, device: str, pack: Path, work: Path, against: Path) -> None:
    """The slice prepared with one layer's routed experts in host memory, its decode step at 1 and 16 rows against
    the all-HBM run `against` (same pack, same call), its logits bit-equal to that run's, and whole Flash on one GPU
    projected: that run's whole-Flash step plus the one-H200 plan's cold layers times the extra of one here."""
    import json

    plan = json.loads(ONE_H200_PLAN.read_text())
    flash_cold = len(plan["placement"]["cold_layers"])
    flash_layers = sum(1 for b in plan["ranks"][0]["layers"] if b["block"].startswith("layers."))
    base = json.loads(against.read_text())
    hot = {int(k): v for k, v in base["data"]["decode"].items() if isinstance(v, dict)}
    context = base["data"]["context"]
    gib = one_cold_layer_gib(pack, context, 16)
    print(f"[host experts] preparing the slice for a {gib:.2f} GiB GPU (one layer's experts in host memory)",
          flush=True)  # fmt: skip
    image = Path(c.tfc("prepare", str(pack), "--store", str(work), "--gpu-memory-gib", f"{gib:.3f}",
                       "--max-context", str(context), "--max-seqs", "16"))  # fmt: skip
    image = image / "rank0" if (image / "rank0").is_dir() else image
    cold = cold_layers_of(image)
    if len(cold) != 1:
        raise RuntimeError(
            f"the placed slice keeps {len(cold)} layers' experts in host memory, not one: {cold}"
        )
    runner = build(image, device, tokens=context + 2048)
    table = step_times(runner, device, [1, 16], context, c.copy_gbps(device))
    out: dict = {"cold_layers": cold, "flash_cold_layers": flash_cold, "flash_layers": flash_layers,
                 "gpu_memory_gib": gib, "pinned_h2d_gbps": c.pinned_h2d_gbps(), "against": against.name}  # fmt: skip
    for rows in (1, 16):
        if table[rows]["logits_sha256"] != hot[rows]["logits_sha256"]:
            raise RuntimeError(f"{rows} rows: the logits with host experts differ from the all-HBM run's")
        extra = table[rows]["step_s"] - hot[rows]["step_s"]
        step = hot[rows]["flash_step_s"] + flash_cold * extra
        out[rows] = {"step_s": table[rows]["step_s"], "all_device_step_s": hot[rows]["step_s"],
                     "extra_per_cold_layer_s": extra, "flash_all_device_tok_s": hot[rows]["flash_tok_s"],
                     "flash_one_gpu_tok_s": rows / step, "logits_equal": True}  # fmt: skip
        print(f"[host experts] {rows} rows: the step {table[rows]['step_s'] * 1e6:,.0f} µs against "
              f"{hot[rows]['step_s'] * 1e6:,.0f} µs all in HBM, logits bit-equal; whole Flash on one GPU "
              f"{rows / step:,.1f} tok/s projected (all in HBM: {hot[rows]['flash_tok_s']:,.1f})", flush=True)  # fmt: skip
    run.data["host_experts"] = out
    for rows in (1, 16):
        o = out[rows]
        run.metric(f"decode.whole_flash_tok_s.one_gpu_streams{rows}", o["flash_one_gpu_tok_s"], "tok/s", None,
                   f"all in HBM {o['flash_all_device_tok_s']:,.1f} tok/s (same call); {flash_cold} of {flash_layers} "
                   f"layers' experts over PCIe, each +{o['extra_per_cold_layer_s'] * 1e6:,.0f} µs a step (the slice "
                   f"with layer {cold[0]}'s in host memory); no peer serves whole Flash EXL3 on one GPU")  # fmt: skip


def main() -> None:
    ap = c.parser(__doc__)
    ap.add_argument(
        "--image", help="a prepared flash-random --layers 4 image's rank folder (default: make one)"
    )
    ap.add_argument(
        "--work", help="where to make the slice when --image is not given (default: a temporary folder)"
    )
    ap.add_argument(
        "--rows", default="1,4,16,64,256", help="rows a step, comma-separated (default: 1,4,16,64,256)"
    )
    ap.add_argument("--host-experts", metavar="PACK",
                    help="whole Flash on one GPU: the slice's pack prepared with one layer's experts in host memory "
                         "(CUDA; needs --against)")  # fmt: skip
    ap.add_argument(
        "--against", help="with --host-experts: the all-HBM decode result (JSON) of the same pack"
    )
    args = ap.parse_args()
    try:
        rows_list = [int(r) for r in args.rows.split(",")]
    except ValueError:
        ap.error(f"--rows takes comma-separated integers, got {args.rows!r}")
    device = c.pick_device(args.device)
    if args.host_experts:
        c.needs_cuda(device, "decode.py --host-experts", "the cold experts are read over PCIe by the GPU")
        if not Path(args.host_experts).is_dir():
            ap.error(
                f"--host-experts: {args.host_experts} is not a pack folder (tfc fixture flash-random --layers 4)"
            )
        if not args.against or not Path(args.against).is_file():
            ap.error("--host-experts needs --against: the all-HBM decode result (JSON) of the same pack")
        if (why := all_hbm_problem(Path(args.against))) is not None:
            ap.error(f"--against {args.against}: {why}")
    elif device == "cpu" and not args.image:
        ap.error("--device cpu runs a smoke of the script on a small image: give --image (the tiny one)")
    c.ensure_tfc()
    import torch

    if device == "cpu":
        torch.set_num_threads(1)
    run = c.Run("decode", "decode.py", device, args.commit)
    if args.host_experts:
        work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tfc-placed-"))
        host_experts(run, device, Path(args.host_experts), work, Path(args.against))
        run.finish(args.json)
        return
    context = CONTEXT[device]
    image = open_image(args)
    runner = build(image, device, tokens=context + 2048, slots=max(16, min(max(rows_list), max_step_rows())))
    copy = c.copy_gbps(device)
    run.data.update(image=str(image), image_bytes=runner.forward.weights.arena.nbytes, context=context,
                    layers=runner.forward.cfg.num_hidden_layers, copy_gbps=copy)  # fmt: skip
    table = step_times(runner, device, rows_list, context, copy)
    run.data["decode"] = table
    layers = runner.forward.cfg.num_hidden_layers
    if device == "cuda":
        run.data["profile"] = kernels_a_step(runner, device, context)
        wide = max((r for r in rows_list if r <= max_step_rows()), default=1)
        if wide > 1:  # where the time of a wide step goes
            run.data[f"profile_rows{wide}"] = kernels_a_step(runner, device, context, wide)
    floor_limit = "the step's byte floor at the memory copy rate of the same run"
    for rows in rows_list:
        row = table.get(rows)
        value = row["floor_ratio"] if isinstance(row, dict) else None
        target = {1: ">= 0.50", 4: None}.get(rows, ">= 0.60")
        limit = f"{floor_limit} ({row['floor_s'] * 1e6:,.0f} µs at {copy:,.0f} GB/s)" if value else f"{row}"
        run.metric(f"decode.floor_ratio.rows{rows}", value, "fraction", target, limit)
    if isinstance(table.get(1), dict):
        run.metric("decode.whole_flash_tok_s.streams1", table[1]["flash_tok_s"], "tok/s", ">= 250 on an H200",
                   f"this run's floor {table[1]['flash_floor_tok_s']:,.0f} tok/s; {PEERS}")  # fmt: skip
    if isinstance(table.get(16), dict):
        run.metric("decode.whole_flash_tok_s.streams16", table[16]["flash_tok_s"], "tok/s", None,
                   f"this run's floor {table[16]['flash_floor_tok_s']:,.0f} tok/s; vLLM 801 (4x RTX PRO 6000), "
                   "SGLang ~1.9K (V4-Flash, 4x H200)")  # fmt: skip
    if "profile" in run.data:
        n = run.data["profile"]["kernels_per_step"]
        run.metric("decode.launches_per_layer", n / layers, "launches", "<= 8",
                   f"kernels of an eager one-row step ({n:.0f}) over its {layers} layers; one persistent layer: 1")  # fmt: skip
    run.finish(args.json and device == "cuda")
    if args.json and device != "cuda":
        print("(--json ignored on the CPU: the smoke's numbers are not figures)")


if __name__ == "__main__":
    main()
