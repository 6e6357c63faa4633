"""The DeepSeek-V4.1 image contract (stdlib only): family name, layer mode records, Engram segment names."""

from __future__ import annotations

from dataclasses import dataclass

FAMILY = "deepseek_v41"  # what a manifest records as its family
MODES = ("swa", "full", "reindex", "reuse")


# `tfc prepare` records one per backbone layer (meta.layer_modes); the runtime reads them, never derives them.
@dataclass(frozen=True)
class LayerMode:
    """How one block attends: its CSA2 mode, compress ratio, KV / index sources, candidate roles and Engram."""

    layer: int
    mode: str  # swa | full | reindex | reuse
    compress_ratio: int
    kv_source: int | None
    index_source: int | None
    is_index_source: bool
    uses_candidates: bool
    is_candidate_source: bool
    engram: bool


# Host-side Engram segments (layout engram.asset.v1), written by the compiler and read by the runtime's hasher.
SEG_TOKEN_MAP = "engram.token_map"  # int32 [tokenizer length]
SEG_MULTIPLIERS = "engram.multipliers"  # int64 [layers, max_ngram]
SEG_PRIMES = "engram.primes"  # int64 [layers, cols]
SEG_OFFSETS = "engram.offsets"  # int64 [layers, cols]
SEG_PARAMS = "engram.params"  # int64 [len(ENGRAM_PARAMS)]
SEG_LAYER_IDS = "engram.layer_ids"  # int64 [layers]
SEG_SHARDS = "engram.shards"  # int64 [world, 2]: column range of every rank
SEG_ROW_RANGES = "engram.row_ranges"  # int64 [layers, 2]: this rank's [lo, hi) of every layer's table
# The scalars of SEG_PARAMS, in order.
ENGRAM_PARAMS = (
    "max_ngram",
    "n_heads",
    "head_dim",
    "pad_id",
    "compressed_vocab",
    "image_token_id",
    "world",
    "rank",
)


def engram_rows_name(layer_id: int) -> str:
    """The segment holding a rank's rows of one Engram layer's table (layout engram.rows.e4m3e8m0.v1)."""
    return f"layers.{layer_id}.engram.rows"
