"""Engram hasher: the spec's scalar loop, chunked == whole, DEAD locality, torch == numpy, image segments."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tfc.packs import deepseek_v41_contract as dsv41
from tfc.packs.engram_layout import hash_multipliers, layout_from_config
from tfc.runtime.models.dsv41 import engram_hash as eh
from tfc.runtime.models.dsv41.engram_hash import DEAD, HashStream, HashTables, TorchHasher, compress, hash_ids

VOCAB = 300  # tokenizer length
IMAGE = 297
CFG = {
    "engram_layer_ids": [1, 5],
    "engram_max_ngram_size": 4,
    "engram_n_heads": 3,
    "engram_head_dim": 64,
    "engram_vocab_size": 1000,
}


def _tables() -> HashTables:
    rng = np.random.default_rng(3)
    token_map = rng.integers(0, 180, VOCAB).astype(np.int32)
    token_map[:180] = rng.permutation(180)  # every compressed id is used
    layout = layout_from_config(CFG)
    mult = hash_multipliers(layout.layer_ids, layout.max_ngram, 180)
    return HashTables(
        token_map, mult, layout.primes_array(), layout.offsets_array(), pad_id=2, dead_ids=(IMAGE,)
    )


TABLES = _tables()


def spec_rows(tables: HashTables, ids: list[int], lookback: list[int]) -> np.ndarray:
    """The per-position loop of spec/engram.md §5, in Python ints."""
    n = tables.max_ngram
    seq = [int(v) for v in compress(tables, [*lookback[-(n - 1) :], *ids])] if lookback or ids else []
    b = min(len(lookback), n - 1)
    pad = tables.pad
    out = np.zeros((len(ids), tables.n_layers, tables.n_cols), np.int64)
    for t in range(len(ids)):
        for layer in range(tables.n_layers):
            h, blocked = 0, False
            for k in range(n):
                pos = b + t - k
                if blocked or pos < 0 or seq[pos] == DEAD:
                    blocked, v = True, pad
                else:
                    v = seq[pos]
                h ^= v * int(tables.multipliers[layer, k])
                assert 0 <= h < 2**63
                if k >= 1:
                    for j in range(tables.n_heads):
                        col = (k - 1) * tables.n_heads + j
                        out[t, layer, col] = h % int(tables.primes[layer, col]) + int(
                            tables.offsets[layer, col]
                        )
    return out


id_lists = st.lists(
    st.one_of(st.integers(0, VOCAB - 1), st.sampled_from([2, IMAGE, -1, VOCAB, VOCAB + 5])), max_size=40
)


@settings(max_examples=60, deadline=None)
@given(ids=id_lists, lookback=st.lists(st.one_of(st.integers(0, VOCAB - 1), st.just(IMAGE)), max_size=5))
def test_vectorised_equals_spec_loop(ids, lookback):
    assert np.array_equal(hash_ids(TABLES, ids, lookback), spec_rows(TABLES, ids, lookback))


def _empty() -> np.ndarray:
    return np.zeros((0, TABLES.n_layers, TABLES.n_cols), np.int64)


@settings(max_examples=80, deadline=None)
@given(ids=id_lists, cuts=st.lists(st.integers(0, 40), max_size=6))
def test_chunked_equals_whole(ids, cuts):
    whole = hash_ids(TABLES, ids)
    bounds = sorted({0, len(ids), *(c for c in cuts if c <= len(ids))})
    stream = HashStream(TABLES)
    pieces = [stream.push(ids[a:b]) for a, b in itertools.pairwise(bounds)]
    assert np.array_equal(np.concatenate([_empty(), *pieces]), whole)
    # a prompt prefix, then decode one token at a time
    split = min(cuts[0] if cuts else 0, len(ids))
    stream = HashStream(TABLES)
    pieces = [stream.push(ids[:split])] + [stream.push([x]) for x in ids[split:]]
    assert np.array_equal(np.concatenate([_empty(), *pieces]), whole)
    # an explicit look-back of raw ids, as the CLI and the runtime pass it
    for t in range(len(ids)):
        assert np.array_equal(hash_ids(TABLES, ids[t:], ids[max(0, t - 5) : t]), whole[t:])


def test_dead_changes_only_the_next_n_positions():
    rng = np.random.default_rng(11)
    for _ in range(30):
        ids = rng.integers(3, 200, 50)
        p = int(rng.integers(0, 50))
        dead = ids.copy()
        dead[p] = IMAGE
        a, b = hash_ids(TABLES, ids), hash_ids(TABLES, dead)
        changed = np.nonzero((a != b).any(axis=(1, 2)))[0]
        assert changed.min() >= p and changed.max() <= p + 3
        assert (a[p : p + 4] != b[p : p + 4]).any(axis=(1, 2)).all()  # and every one of them changes


def test_start_pads_and_dead_kinds_agree():
    ids = [5, 6, 7, 8]
    # a full look-back of DEAD ids (image, -1, past the map) reads like the sequence start
    for dead in (IMAGE, -1, VOCAB):
        assert np.array_equal(hash_ids(TABLES, ids, [dead] * 3), hash_ids(TABLES, ids))
    assert not np.array_equal(hash_ids(TABLES, ids, [9, 9, 9]), hash_ids(TABLES, ids))
    assert list(compress(TABLES, [IMAGE, -1, VOCAB, 2])) == [DEAD, DEAD, DEAD, TABLES.pad]


def test_large_random_matches_torch_and_spec():
    rng = np.random.default_rng(5)
    ids = rng.integers(-1, VOCAB + 3, 70_000)  # more than one block, two threads
    rows = eh.hash_compressed(TABLES, compress(TABLES, ids), threads=2)
    assert np.array_equal(rows, hash_ids(TABLES, ids))
    torch_rows = TorchHasher(TABLES).rows(ids[1000:], ids[997:1000]).numpy()
    assert np.array_equal(torch_rows, rows[1000:])
    assert np.array_equal(rows[:50], spec_rows(TABLES, ids[:50].tolist(), []))
    assert (rows >= 0).all() and (rows < TABLES.offsets[:, -1:] + TABLES.primes[:, -1:]).all()


def test_tables_from_segments_roundtrip():
    params = np.array([4, 3, 64, 2, 180, IMAGE, 1, 0], np.int64)
    segs = {
        dsv41.SEG_TOKEN_MAP: TABLES.token_map,
        dsv41.SEG_MULTIPLIERS: TABLES.multipliers,
        dsv41.SEG_PRIMES: TABLES.primes,
        dsv41.SEG_OFFSETS: TABLES.offsets,
        dsv41.SEG_PARAMS: params,
    }
    back = eh.tables_from_segments(segs.__getitem__)
    ids = np.random.default_rng(1).integers(0, VOCAB, 30)
    assert np.array_equal(hash_ids(back, ids), hash_ids(TABLES, ids))
    with pytest.raises(eh.EngramHashError, match=r"engram\.params"):
        eh.tables_from_segments({**segs, dsv41.SEG_PARAMS: params[:5]}.__getitem__)
