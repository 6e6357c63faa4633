"""Build the fast runner over a booted rank: weights as arena views, the ops, KV memory, rope tables, graphs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from tfc.packs.deepseek_v41_contract import FAMILY, SEG_ROW_RANGES, SEG_TOKEN_MAP, engram_rows_name
from tfc.runtime.models.dsv41.config import config_from_dict
from tfc.runtime.models.dsv41.fast.forward import FastForward, StepBuffers
from tfc.runtime.models.dsv41.fast.graph_keys import CONTEXT_STEP, MAX_ROWS, SEQ_ROWS, context_buckets
from tfc.runtime.models.dsv41.fast.kv.layout import PAGE_TOKENS, KvLayout, kv_layout
from tfc.runtime.models.dsv41.fast.kv.memory import KvMemory
from tfc.runtime.models.dsv41.fast.rope import RopeTables
from tfc.runtime.models.dsv41.fast.runner import FastRunner
from tfc.runtime.models.dsv41.fast.weights import FastWeights
from tfc.runtime.models.dsv41.shard import shard_of
from tfc.runtime.parallel.comm import SOLO
from tfc.runtime.worker.step import DEFAULT_SLOTS, Capacity, ModelInfo

from tfc.errors import TfcError

DEFAULT_CONTEXT = 65536  # tokens a slot may hold unless asked otherwise (the model allows 1M)
# Rows of a prefill step by device unless asked otherwise. CUDA: the many-row kernels' MoE decodes every expert a
# step hits once a step, so rows a step set how many rows share a decode (benchmarks/prefill_h200.py --widths).
# CPU: the kernels' torch references gain nothing from width and pay for every padding row, so the narrowest.
PREFILL_ROWS = {"cuda": 2048, "cpu": 32}
DEFAULT_KV_TOKENS = 1 << 20  # the page pool unless asked otherwise (shared by the slots; Flash: 890 MB)
KV_SHARE = 0.5  # of the device memory free after the weights, what auto-sized slots' KV memory may take


class FastBuildError(TfcError):
    """An image or option the fast forward cannot run."""


def build_fast(
    booted: Any,
    *,
    engram: bool = True,
    slots: int | None = DEFAULT_SLOTS,
    tokens_per_slot: int | None = None,
    kv_tokens: int | None = None,
    exact: bool = True,
    page_tokens: int = PAGE_TOKENS,
    context_step: int = CONTEXT_STEP,
    ops: Any = None,
    draft: bool = True,
    progress: Callable[[int, int], None] | None = None,
    prefill_rows: int | None = None,
    comm: Any = None,
    tp_exact: bool = False,
) -> FastRunner:
    """The fast runner over a booted rank (`comm`: its world's collectives, none at TP=1; `tp_exact`, always on a
    TP=N rank: the products of fast/tp.py, which make TP=N equal TP=1, for a TP=1 build held to the worlds);
    `kv_tokens` (default slots x tokens_per_slot, at most DEFAULT_KV_TOKENS) sizes the page pool the slots share;
    `slots=None`: as many as KV_SHARE of the device's free memory holds at tokens_per_slot tokens each
    (auto_slots), up to MAX_ROWS, each sure of its context; `draft` builds the DSpark drafter on the arena
    (fast/dspark.py) when the image has one, and the step's hidden capture for it; `prefill_rows` sizes the prefill forward's
    wide steps that prompt rows take (default: the device's PREFILL_ROWS in an exact build; 0, and always
    with `tp_exact`: prompts take the decode steps)."""
    from tfc.runtime.models.dsv41.reference.runner import MissingEngramTables

    opened, arena = booted.image, booted.arena
    m = opened.manifest
    if m.family != FAMILY:
        raise FastBuildError(f"{opened.path}: a {m.family} image; the fast forward runs DeepSeek-V4.1")
    meta = m.meta or {}
    cfg = config_from_dict(meta.get("pack_config") or {}, meta.get("layer_modes"), str(opened.path))
    if context_step % page_tokens:
        raise FastBuildError(f"context buckets of {context_step} tokens are not whole pages of {page_tokens}")
    dev = arena.device
    if ops is None:
        if dev.type == "cuda":
            from tfc.runtime.models.dsv41.fast.ops import TritonOps

            torch.backends.cuda.matmul.allow_tf32 = False  # fp32 products stay fp32 (the mHC mix, attention)
            torch.backends.cudnn.allow_tf32 = False
            ops = TritonOps(dev, exact)
            if os.environ.get("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "0") not in ("", "0"):
                ops.notes.append(
                    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE is set: fp32 products run as TF32 (unset it)"
                )
        else:
            from tfc.runtime.models.dsv41.fast.ops_reference import ReferenceOps

            ops = ReferenceOps()
    weights = FastWeights(opened, arena, cfg, getattr(booted, "off_device", None))
    shard = shard_of(m, cfg, weights, comm or SOLO, dev)
    tp_exact = tp_exact or shard.world > 1
    notes = []
    if (
        tp_exact
    ):  # the prefill forward's wide kernels take no rank's shares yet: prompts take the decode steps
        prefill_rows = 0
    if shard.world > 1:  # nor does the drafter
        draft = False
        notes.append(f"rank {shard.rank} of TP={shard.world}: prompts take the decode steps, no drafting")
    for layer in range(cfg.num_hidden_layers):  # checks every table's index arrays once, on the host
        weights.experts(f"layers.{layer}")
        if progress is not None:
            progress(layer + 1, cfg.num_hidden_layers)
    tokens_per_slot = min(cfg.max_position_embeddings, tokens_per_slot or DEFAULT_CONTEXT)
    buckets = context_buckets(tokens_per_slot, step=context_step)
    if prefill_rows is None:  # a loose build's steps run the live rows: its prompts would not be exact
        prefill_rows = PREFILL_ROWS.get(dev.type, 0) if exact else 0
    if prefill_rows and prefill_rows <= SEQ_ROWS:
        raise FastBuildError(f"prefill steps of {prefill_rows} rows: more than {SEQ_ROWS}, or 0 for none")
    layout = kv_layout(cfg, max(SEQ_ROWS, prefill_rows), page_tokens)
    if slots is None:  # every rank of a world takes the fewest any rank's memory holds
        slots = auto_slots(layout, tokens_per_slot, free_bytes(dev))
        if shard.world > 1:
            held = shard.comm.all_gather(torch.tensor([slots], dtype=torch.int64, device=dev))
            slots = min(int(t.item()) for t in held)
        kv_tokens = kv_tokens or slots * tokens_per_slot
    kv_tokens = kv_tokens or min(slots * tokens_per_slot, DEFAULT_KV_TOKENS)
    kv = KvMemory(layout, slots, kv_tokens, tokens_per_slot, buckets[-1], dev)
    tables, row_lo = None, ()
    if engram and cfg.engram_layer_ids:
        names = [SEG_TOKEN_MAP, *(engram_rows_name(layer) for layer in cfg.engram_layer_ids)]
        if not all(weights.has(n) for n in names):
            raise MissingEngramTables(
                f"{opened.path}: the model has Engram layers {list(cfg.engram_layer_ids)} but the image holds "
                "no Engram tables; prepare it with --engram-dir, or pass --no-engram"
            )
        from tfc.runtime.models.dsv41.engram_hash import tables_from_segments

        tables = tables_from_segments(weights.host_array)
        row_lo = tuple(int(r[0]) for r in weights.host_array(SEG_ROW_RANGES))
    capture = tuple(cfg.dspark_target_layer_ids) if draft and cfg.num_nextn_predict_layers > 0 else ()
    cols = shard.engram_cols[shard.rank] if shard.engram_cols else (0, cfg.engram_cols)
    buffers = StepBuffers(cfg.vocab_size, len(row_lo), cols[1] - cols[0], dev, len(capture) * cfg.hidden_size)
    rope = RopeTables(cfg, tokens_per_slot, dev)
    forward = FastForward(cfg, weights, ops, kv, rope, buffers, tables is not None, capture, shard, tp_exact)
    prefill = None
    if prefill_rows:
        wide = StepBuffers(cfg.vocab_size, len(row_lo), cols[1] - cols[0], dev, len(capture) * cfg.hidden_size,
                           prefill_rows)  # fmt: skip
        prefill = FastForward(cfg, weights, ops.for_prefill(prefill_rows), kv, rope, wide, tables is not None, capture,
                              shard, tp_exact, wide=True)  # fmt: skip
    if tables is not None:  # Engram layers placed in host memory or on NVMe read their rows through staging
        _stage_off_device(booted, cfg, row_lo, cols[1] - cols[0], forward, prefill)
    drafter, note = None, "built without a drafter (draft=False)"
    if draft:
        from tfc.runtime.models.dsv41.dspark.fast import fast_dspark_slots

        drafter, note = fast_dspark_slots(forward, booted.graphs)
        if drafter is None:
            forward.capture = ()  # nothing reads the rows
            if prefill is not None:
                prefill.capture = ()
    eos = () if cfg.eos_token_id is None else (int(cfg.eos_token_id),)
    warnings = ()
    if cfg.engram_layer_ids and tables is None:
        warnings = (f"--no-engram: Engram layers {list(cfg.engram_layer_ids)} run WITHOUT their memory tables "
                    "(gate off); outputs are not the model's",)  # fmt: skip
    info = ModelInfo(FAMILY, cfg.vocab_size, tokens_per_slot, cfg.bos_token_id, eos, warnings)
    return FastRunner(forward, booted.graphs, tables, row_lo, info, Capacity(slots, tokens_per_slot), buckets,
                      (*getattr(ops, "notes", ()), *notes), drafter, note, prefill)  # fmt: skip


def _stage_off_device(booted: Any, cfg: Any, row_lo: tuple[int, ...], cols: int, *forwards: Any) -> None:
    """Give each forward the staging of the Engram layers whose rows the boot placed off the device."""
    off = getattr(booted, "off_device", None)
    sources = {}
    for k, layer in enumerate(cfg.engram_layer_ids):
        src = None if off is None else off.source(engram_rows_name(layer))
        if src is not None:
            sources[k] = src
    if not sources:
        return
    from tfc.runtime.models.dsv41.fast.engram_staging import EngramStaging

    for forward in forwards:
        if forward is not None:
            forward.staging = EngramStaging(
                sources, row_lo, forward.buffers.rows, cols, forward.buffers.ints.device
            )


def free_bytes(device: torch.device) -> int | None:
    """Device memory free now (None off a GPU)."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None


def auto_slots(layout: KvLayout, tokens_per_slot: int, free: int | None) -> int:
    """Slots whose every sequence can reach tokens_per_slot tokens in KV_SHARE of `free` bytes, 1 .. MAX_ROWS (one
    step holds them all); DEFAULT_SLOTS without a figure."""
    if free is None:
        return DEFAULT_SLOTS
    per_slot = layout.bytes_per_slot + layout.bytes_per_token * tokens_per_slot
    return max(1, min(MAX_ROWS, int(free * KV_SHARE // per_slot)))
