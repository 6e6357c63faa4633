"""Engram layout: primes, offsets, multipliers, column order and TP head shards against the spec facts."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from tfc.fixtures.flash_headers import flash_text_config
from tfc.packs.engram_layout import (
    EngramConfigError,
    check_layout,
    compute_primes,
    hash_multipliers,
    head_shards,
    is_prime,
    layer_rows,
    layout_from_config,
    next_prime,
)

FLASH = {k: v for k, v in flash_text_config().items() if k.startswith("engram_")}


@pytest.fixture(scope="module")
def flash():
    return check_layout({"text_config": FLASH})


def test_spec_facts(flash):
    assert flash.primes[0][0] == 16_000_057
    assert flash.primes[0][23] == 16_000_463
    assert flash.primes[1][0] == 16_000_477
    assert flash.primes[1][23] == 16_000_889
    assert flash.offsets[0][23] == 368_005_705
    assert flash.offsets[1][23] == 368_015_793
    assert flash.rows == (384_006_168, 384_016_682)
    assert sum(flash.rows) == 768_022_850
    assert flash.row_bytes == 264 and flash.n_cols == 24
    assert layer_rows(FLASH) == [384_006_168, 384_016_682]


def test_primes_are_the_consecutive_primes_above_the_base(flash):
    flat = [p for layer in flash.primes for p in layer]
    assert len(set(flat)) == 48
    n = flat[0]
    for p in flat[1:]:  # nothing prime is skipped between two handed-out primes
        assert all(not is_prime(q) for q in range(n + 1, p))
        n = p


def test_is_prime_matches_a_sieve():
    rng = np.random.default_rng(7)
    base = int(rng.integers(10**6, 10**7))
    sieve = np.ones(20_000, bool)
    nums = np.arange(base, base + 20_000)
    for d in range(2, int((base + 20_000) ** 0.5) + 1):
        sieve[(nums % d == 0) & (nums != d)] = False
    assert [is_prime(int(n)) for n in nums] == sieve.tolist()
    assert not is_prime(3_215_031_751) and is_prime(2_147_483_647)  # strong pseudoprime to 2,3,5,7; a prime


def test_next_prime_strictly_greater_and_skips_seen():
    assert next_prime(13, set()) == 17
    assert next_prime(12, {13}) == 17
    assert compute_primes([0], 3, 2, 14) == [[17, 19, 23, 29]]  # seen spans orders: the scan restarts at 13


def test_multipliers_pinned_odd_and_bounded():
    m = hash_multipliers([1, 14], 4, 99_092)
    assert m.dtype == np.int64 and m.shape == (2, 4)
    assert m[0].tolist() == [76632096046245, 4839876093313, 35959672319349, 73987337458391]
    assert m[1].tolist() == [67716810739261, 51510806800915, 30921347202721, 82619226485591]
    assert (m % 2 == 1).all()
    assert (m.astype(object) * 99_091 < 2**63).all()  # products of any compressed id never overflow


@pytest.mark.parametrize("world", [1, 2, 3, 4, 8])
def test_head_shards_cover_every_column_once(flash, world):
    shards = head_shards(flash.n_cols, world)
    assert len(shards) == world
    cols = [c for s in shards for c in s]
    assert cols == list(range(24))
    for layer in range(2):
        spans = [flash.rank_rows(layer, world, r) for r in range(world)]
        assert spans[0][0] == 0 and spans[-1][1] == flash.rows[layer]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def test_tp2_split_by_whole_heads(flash):
    assert flash.rank_columns(2, 0) == range(0, 12)
    assert flash.rank_columns(4, 3) == range(18, 24)
    assert flash.order_head(12) == (3, 4) and flash.column(3, 4) == 12


def test_row_count_mismatch_refused():
    bad = dict(FLASH, engram_num_embeddings=[384_006_168, 384_016_681])
    with pytest.raises(EngramConfigError, match="384016681 rows for Engram layer 14"):
        check_layout(bad)
    with pytest.raises(EngramConfigError, match="one entry per Engram layer"):
        check_layout(dict(FLASH, engram_num_embeddings=[1]))
    with pytest.raises(EngramConfigError, match="multiple of 32"):
        layout_from_config(dict(FLASH, engram_head_dim=48))
    with pytest.raises(EngramConfigError, match="engram_n_heads"):
        layout_from_config({k: v for k, v in FLASH.items() if k != "engram_n_heads"})
