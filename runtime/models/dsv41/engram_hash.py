"""The Engram n-gram hasher: table rows of every (position, layer, column), on the host or the device."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tfc.packs.deepseek_v41_contract import (
    ENGRAM_PARAMS,
    SEG_MULTIPLIERS,
    SEG_OFFSETS,
    SEG_PARAMS,
    SEG_PRIMES,
    SEG_TOKEN_MAP,
)

from tfc.errors import TfcError

_BLOCK = 1 << 15  # positions per block: keeps temporaries in cache
DEAD = -1  # a compressed id that blocks every n-gram through it (image tokens, masked positions)


class EngramHashError(TfcError):
    """Hash tables or token ids that the hasher cannot use."""


@dataclass(frozen=True)
class HashTables:
    """Everything the hash needs, as stored in an image's host-side Engram segments."""

    token_map: np.ndarray  # int32/int64 [tokenizer length] -> compressed id
    multipliers: np.ndarray  # int64 [layers, max_ngram]
    primes: np.ndarray  # int64 [layers, cols]
    offsets: np.ndarray  # int64 [layers, cols]
    pad_id: int  # the uncompressed pad id (compressed through the map)
    dead_ids: tuple[int, ...] = ()  # token ids that are image positions
    n_heads: int = field(default=0)

    def __post_init__(self) -> None:
        m, p, o = self.multipliers, self.primes, self.offsets
        if m.ndim != 2 or m.shape[1] < 2 or p.shape != o.shape or p.ndim != 2 or p.shape[0] != m.shape[0]:
            raise EngramHashError(
                f"Engram hash tables disagree: multipliers {m.shape}, primes {p.shape}, offsets {o.shape}"
            )
        heads = self.n_heads or p.shape[1] // (m.shape[1] - 1)
        if heads * (m.shape[1] - 1) != p.shape[1]:
            raise EngramHashError(f"{p.shape[1]} Engram columns do not split into {m.shape[1] - 1} orders")
        object.__setattr__(self, "n_heads", heads)
        if not 0 <= self.pad_id < len(self.token_map):
            raise EngramHashError(
                f"Engram pad id {self.pad_id} is outside the token map ({len(self.token_map)})"
            )

    @property
    def max_ngram(self) -> int:
        return int(self.multipliers.shape[1])

    @property
    def n_layers(self) -> int:
        return int(self.multipliers.shape[0])

    @property
    def n_cols(self) -> int:
        return int(self.primes.shape[1])

    @property
    def pad(self) -> int:
        """The compressed pad id."""
        return int(self.token_map[self.pad_id])


def compress(tables: HashTables, ids: Sequence[int] | np.ndarray) -> np.ndarray:
    """Compressed ids (int64); image tokens, -1 and ids past the map become DEAD."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    n = len(tables.token_map)
    live = (ids >= 0) & (ids < n)
    for dead in tables.dead_ids:
        live &= ids != dead
    out = np.full(ids.shape, DEAD, dtype=np.int64)
    out[live] = tables.token_map[ids[live]]
    return out


def hash_compressed(
    tables: HashTables,
    x: np.ndarray,
    lookback: np.ndarray | None = None,
    out: np.ndarray | None = None,
    threads: int | None = None,
) -> np.ndarray:
    """Rows int64 [T, layers, cols] of compressed ids `x`, after up to max_ngram-1 compressed look-back ids."""
    n_back = tables.max_ngram - 1
    back = np.zeros(0, np.int64) if lookback is None else np.asarray(lookback, np.int64).reshape(-1)
    back = back[len(back) - min(len(back), n_back) :]
    x = np.asarray(x, np.int64).reshape(-1)
    t = x.shape[0]
    # missing look-back reads as DEAD: the sequence starts here
    full = np.concatenate([np.full(n_back - back.shape[0], DEAD, np.int64), back, x])
    rows = np.empty((t, tables.n_layers, tables.n_cols), np.int64) if out is None else out
    if rows.shape != (t, tables.n_layers, tables.n_cols) or rows.dtype != np.int64:
        raise EngramHashError(
            f"output rows must be int64 {(t, tables.n_layers, tables.n_cols)}, got {rows.shape}"
        )
    blocks = [(s, min(s + _BLOCK, t)) for s in range(0, t, _BLOCK)]
    workers = min(len(blocks), threads or _threads())
    if workers <= 1:
        for s, e in blocks:
            _hash_block(tables, full, s, e, rows[s:e])
    else:  # numpy drops the GIL in its ufuncs, so blocks hash in parallel
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda se: _hash_block(tables, full, se[0], se[1], rows[se[0] : se[1]]), blocks))
    return rows


def _hash_block(tables: HashTables, full: np.ndarray, s: int, e: int, rows: np.ndarray) -> None:
    """Rows of positions s..e-1; `full` holds max_ngram-1 look-back ids then the sequence."""
    n_back, heads = tables.max_ngram - 1, tables.n_heads
    m = np.asarray(tables.multipliers, np.int64)
    primes = np.asarray(tables.primes, np.int64)[None]
    offsets = np.asarray(tables.offsets, np.int64)[None]
    blocked = np.zeros(e - s, bool)
    h = np.zeros((e - s, tables.n_layers), np.int64)
    prod = np.empty_like(h)
    for k in range(tables.max_ngram):
        v = full[n_back + s - k : n_back + e - k]
        blocked |= v == DEAD
        v = np.where(blocked, np.int64(tables.pad), v)
        np.multiply(v[:, None], m[None, :, k], out=prod)
        h ^= prod
        if k >= 1:
            cols = slice((k - 1) * heads, k * heads)
            dst = rows[:, :, cols]
            np.remainder(h[:, :, None], primes[:, :, cols], out=dst)
            dst += offsets[:, :, cols]


def _threads() -> int:
    return max(
        1, min(8, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    )


def hash_ids(
    tables: HashTables, ids: Sequence[int] | np.ndarray, lookback: Sequence[int] | np.ndarray = ()
) -> np.ndarray:
    """Rows int64 [T, layers, cols] of token ids, given up to max_ngram-1 earlier token ids."""
    back = np.asarray(lookback, np.int64).reshape(-1)[-(tables.max_ngram - 1) :]
    return hash_compressed(tables, compress(tables, ids), compress(tables, back))


class HashStream:
    """One sequence hashed piece by piece; carries the compressed look-back across calls."""

    def __init__(self, tables: HashTables, lookback: Sequence[int] | np.ndarray = ()) -> None:
        self.tables = tables
        self.lookback = compress(tables, lookback)[-(tables.max_ngram - 1) :]

    def push(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Rows of the next piece of the sequence."""
        x = compress(self.tables, ids)
        rows = hash_compressed(self.tables, x, self.lookback)
        self.lookback = np.concatenate([self.lookback, x])[-(self.tables.max_ngram - 1) :]
        return rows


class TorchHasher:
    """The same hash with torch int64 ops, for the device; tables live on `device`."""

    def __init__(self, tables: HashTables, device: Any = "cpu") -> None:
        import torch

        self.torch = torch
        self.tables = tables
        self.token_map = torch.as_tensor(np.asarray(tables.token_map, np.int64), device=device)
        self.m = torch.as_tensor(np.asarray(tables.multipliers, np.int64), device=device)
        self.primes = torch.as_tensor(np.asarray(tables.primes, np.int64), device=device)
        self.offsets = torch.as_tensor(np.asarray(tables.offsets, np.int64), device=device)
        self.dead_ids = torch.as_tensor(list(tables.dead_ids), dtype=torch.int64, device=device)
        self.pad = tables.pad
        self.device = device

    def compress(self, ids: Any) -> Any:
        """Compressed ids; image tokens, negatives and ids past the map become DEAD."""
        torch = self.torch
        ids = torch.as_tensor(ids, dtype=torch.int64, device=self.device).reshape(-1)
        live = (ids >= 0) & (ids < self.token_map.shape[0])
        if self.dead_ids.numel():
            live &= ~torch.isin(ids, self.dead_ids)
        mapped = self.token_map[torch.where(live, ids, torch.zeros_like(ids))]
        return torch.where(live, mapped, torch.full_like(ids, DEAD))

    def rows(self, ids: Any, lookback: Any = ()) -> Any:
        """Rows int64 [T, layers, cols] of token ids after up to max_ngram-1 earlier token ids."""
        torch = self.torch
        n_back = self.tables.max_ngram - 1
        back = self.compress(lookback)[-n_back:] if n_back else self.compress(())
        x = self.compress(ids)
        t, b = x.shape[0], back.shape[0]
        full = torch.cat([torch.full((n_back - b,), DEAD, dtype=torch.int64, device=self.device), back, x])
        heads = self.tables.n_heads
        out = torch.empty((t, self.m.shape[0], self.primes.shape[1]), dtype=torch.int64, device=self.device)
        blocked = torch.zeros(t, dtype=torch.bool, device=self.device)
        h = torch.zeros((t, self.m.shape[0]), dtype=torch.int64, device=self.device)
        for k in range(self.tables.max_ngram):
            v = full[n_back - k : n_back - k + t]
            blocked = blocked | (v == DEAD)
            v = torch.where(blocked, torch.full_like(v, self.pad), v)
            h = h ^ (v[:, None] * self.m[None, :, k])
            if k >= 1:
                cols = slice((k - 1) * heads, k * heads)
                out[:, :, cols] = h[:, :, None] % self.primes[None, :, cols] + self.offsets[None, :, cols]
        return out


def lookback_of(ids: Iterable[int], max_ngram: int) -> list[int]:
    """The look-back a later piece needs: the last max_ngram-1 ids of the earlier ones."""
    ids = list(ids)
    return ids[-(max_ngram - 1) :] if max_ngram > 1 else []


def params_of(get: Callable[[str], np.ndarray]) -> dict[str, int]:
    """The named scalars of the `engram.params` segment."""
    raw = np.asarray(get(SEG_PARAMS)).reshape(-1)
    if raw.shape[0] != len(ENGRAM_PARAMS):
        raise EngramHashError(
            f"segment {SEG_PARAMS} holds {raw.shape[0]} values, expected {len(ENGRAM_PARAMS)}"
        )
    return {name: int(v) for name, v in zip(ENGRAM_PARAMS, raw, strict=True)}


def tables_from_segments(get: Callable[[str], np.ndarray]) -> HashTables:
    """HashTables from an image's host-side Engram segments; `get(name)` returns the segment's array."""
    params = params_of(get)
    token_map = np.asarray(get(SEG_TOKEN_MAP))
    multipliers = np.asarray(get(SEG_MULTIPLIERS), np.int64)
    if multipliers.ndim != 2 or multipliers.shape[1] != params["max_ngram"]:
        raise EngramHashError(
            f"segment {SEG_MULTIPLIERS} has shape {multipliers.shape}, max_ngram {params['max_ngram']}"
        )
    if token_map.size and int(token_map.max()) >= params["compressed_vocab"]:
        raise EngramHashError(f"segment {SEG_TOKEN_MAP} has ids past the compressed vocabulary")
    dead = (params["image_token_id"],) if params["image_token_id"] >= 0 else ()
    return HashTables(
        token_map=token_map,
        multipliers=multipliers,
        primes=np.asarray(get(SEG_PRIMES), np.int64),
        offsets=np.asarray(get(SEG_OFFSETS), np.int64),
        pad_id=params["pad_id"],
        dead_ids=dead,
        n_heads=params["n_heads"],
    )
