"""Engram hash layout: prime table sizes, offsets, multipliers, column order and TP head shards."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from tfc.packs.errors import ConfigError

# Row format of a table shard: head_dim e4m3 bytes, then one e8m0 scale byte per SCALE_BLOCK values.
SCALE_BLOCK = 32
MULTIPLIER_SEED = 0
LAYER_SEED_STRIDE = 10007

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # deterministic below 3.3e24
_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


class EngramConfigError(ConfigError):
    """The Engram part of a config is inconsistent (row counts, sizes, layer ids)."""


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin primality for any n below 3.3e24."""
    if n < 2:
        return False
    for p in _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d //= 2
        s += 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def next_prime(start: int, seen: set[int]) -> int:
    """The smallest prime strictly greater than `start` that is not in `seen`."""
    candidate = start + 1
    while candidate in seen or not is_prime(candidate):
        candidate += 1
    return candidate


def config_field(cfg: Any, key: str) -> Any:
    """A text_config field from a dict (nested `text_config` or flat) or a config object."""
    if isinstance(cfg, Mapping):
        source = cfg.get("text_config", cfg) if isinstance(cfg.get("text_config"), Mapping) else cfg
        if key not in source:
            raise EngramConfigError(f"config has no `{key}`")
        return source[key]
    if not hasattr(cfg, key):
        raise EngramConfigError(f"config has no `{key}`")
    return getattr(cfg, key)


def _int(cfg: Any, key: str, low: int = 0) -> int:
    value = config_field(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise EngramConfigError(f"config `{key}` must be an integer >= {low}, got {value!r}")
    return value


@dataclass(frozen=True)
class EngramLayout:
    """Where every (layer, column) of the Engram tables lives; columns are order-major, head-minor."""

    layer_ids: tuple[int, ...]
    max_ngram: int
    n_heads: int
    head_dim: int
    vocab_size: int
    primes: tuple[tuple[int, ...], ...]  # [layer index][column]
    offsets: tuple[tuple[int, ...], ...]  # exclusive prefix sums of primes, per layer

    @property
    def n_layers(self) -> int:
        return len(self.layer_ids)

    @property
    def n_cols(self) -> int:
        return (self.max_ngram - 1) * self.n_heads

    @property
    def rows(self) -> tuple[int, ...]:
        """Table rows of every Engram layer (Σ of its primes)."""
        return tuple(off[-1] + p[-1] for off, p in zip(self.offsets, self.primes, strict=True))

    @property
    def row_bytes(self) -> int:
        """Bytes of one stored row: head_dim e4m3 values then head_dim/32 e8m0 scales."""
        return self.head_dim + self.head_dim // SCALE_BLOCK

    def column(self, order: int, head: int) -> int:
        """Column of n-gram order `order` (2..max_ngram) and head `head`."""
        if not (2 <= order <= self.max_ngram and 0 <= head < self.n_heads):
            raise ValueError(f"no column for order {order}, head {head}")
        return (order - 2) * self.n_heads + head

    def order_head(self, col: int) -> tuple[int, int]:
        """(n-gram order, head) of a column."""
        return col // self.n_heads + 2, col % self.n_heads

    def rank_columns(self, world: int, rank: int) -> range:
        """Columns owned by `rank` of a TP world (complete heads, rank-major)."""
        return head_shards(self.n_cols, world)[rank]

    def rank_rows(self, layer_index: int, world: int, rank: int) -> tuple[int, int]:
        """The contiguous [lo, hi) row range of a layer's table that `rank` holds."""
        cols = self.rank_columns(world, rank)
        if not cols:
            return 0, 0
        offsets, primes = self.offsets[layer_index], self.primes[layer_index]
        return offsets[cols.start], offsets[cols.stop - 1] + primes[cols.stop - 1]

    def primes_array(self) -> np.ndarray:
        return np.asarray(self.primes, dtype=np.int64).reshape(self.n_layers, self.n_cols)

    def offsets_array(self) -> np.ndarray:
        return np.asarray(self.offsets, dtype=np.int64).reshape(self.n_layers, self.n_cols)


def head_shards(n_cols: int, world: int) -> list[range]:
    """Column ranges of every rank: part = ceil(cols / world), rank r owns [r*part, (r+1)*part)."""
    if world < 1:
        raise ValueError(f"TP world must be >= 1, got {world}")
    part = math.ceil(n_cols / world)
    return [range(min(r * part, n_cols), min((r + 1) * part, n_cols)) for r in range(world)]


def compute_primes(
    layer_ids: Sequence[int], max_ngram: int, n_heads: int, vocab_size: int
) -> list[list[int]]:
    """Prime table size of every (layer, column); `seen` spans all layers and orders."""
    seen: set[int] = set()
    out = []
    for _ in layer_ids:
        cols = []
        for _order in range(2, max_ngram + 1):
            cur = vocab_size - 1  # the scan restarts per order; `seen` keeps primes distinct
            for _head in range(n_heads):
                cur = next_prime(cur, seen)
                seen.add(cur)
                cols.append(cur)
        out.append(cols)
    return out


def hash_multipliers(
    layer_ids: Sequence[int], max_ngram: int, compressed_vocab: int, seed: int = MULTIPLIER_SEED
) -> np.ndarray:
    """Odd int64 multipliers [layers, max_ngram]; bounded so x * m never overflows for x < vocab."""
    if compressed_vocab < 1:
        raise EngramConfigError(f"compressed vocabulary must be >= 1, got {compressed_vocab}")
    bound = max(1, (np.iinfo(np.int64).max // compressed_vocab) // 2)
    rows = []
    for layer in layer_ids:
        rng = np.random.default_rng(seed + LAYER_SEED_STRIDE * layer)
        rows.append(rng.integers(0, bound, size=max_ngram, dtype=np.int64) * 2 + 1)
    return np.stack(rows).astype(np.int64) if rows else np.zeros((0, max_ngram), np.int64)


def layout_from_config(cfg: Any) -> EngramLayout:
    """The Engram layout of a text_config (dict or DeepseekV41Config); rows are not checked here."""
    layer_ids = config_field(cfg, "engram_layer_ids")
    if not isinstance(layer_ids, Sequence) or isinstance(layer_ids, str):
        raise EngramConfigError(f"config `engram_layer_ids` must be a list, got {layer_ids!r}")
    if any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in layer_ids):
        raise EngramConfigError(f"config `engram_layer_ids` must hold layer numbers, got {layer_ids!r}")
    if len(set(layer_ids)) != len(layer_ids):
        raise EngramConfigError(f"config `engram_layer_ids` repeats a layer: {list(layer_ids)}")
    max_ngram = _int(cfg, "engram_max_ngram_size", 2)
    n_heads = _int(cfg, "engram_n_heads", 1)
    head_dim = _int(cfg, "engram_head_dim", SCALE_BLOCK)
    vocab_size = _int(cfg, "engram_vocab_size", 1)
    if head_dim % SCALE_BLOCK:
        raise EngramConfigError(f"config `engram_head_dim` {head_dim} is not a multiple of {SCALE_BLOCK}")
    if len(layer_ids) * (max_ngram - 1) * n_heads > 4096:
        raise EngramConfigError("config asks for more than 4096 Engram columns")
    primes = compute_primes(layer_ids, max_ngram, n_heads, vocab_size)
    offsets = []
    for layer_primes in primes:
        offs, total = [], 0
        for p in layer_primes:
            offs.append(total)
            total += p
        offsets.append(tuple(offs))
    return EngramLayout(
        layer_ids=tuple(layer_ids),
        max_ngram=max_ngram,
        n_heads=n_heads,
        head_dim=head_dim,
        vocab_size=vocab_size,
        primes=tuple(tuple(p) for p in primes),
        offsets=tuple(offsets),
    )


def layer_rows(cfg: Any) -> list[int]:
    """Table rows of every Engram layer (Σ of its primes), for fixtures writing `engram_num_embeddings`."""
    return list(layout_from_config(cfg).rows)


def check_layout(cfg: Any) -> EngramLayout:
    """The layout of a config whose `engram_num_embeddings` equal the computed prime sums, else refuse."""
    layout = layout_from_config(cfg)
    stored = config_field(cfg, "engram_num_embeddings")
    if not isinstance(stored, Sequence) or len(stored) != layout.n_layers:
        raise EngramConfigError(
            f"config `engram_num_embeddings` {stored!r} must have one entry per Engram layer "
            f"{list(layout.layer_ids)}"
        )
    for layer, want, got in zip(layout.layer_ids, layout.rows, stored, strict=True):
        if got != want:
            raise EngramConfigError(
                f"config `engram_num_embeddings` says {got} rows for Engram layer {layer}, "
                f"but its primes sum to {want}"
            )
    return layout
