"""The fast runner's host side on the CPU: graph keys (row and context buckets) and step plans cut into steps."""

from __future__ import annotations

import pytest
from tfc.runtime.models.dsv41.fast.graph_keys import (
    CHUNK_ROWS,
    MAX_ROWS,
    ROW_BUCKETS,
    SEQ_ROWS,
    StepKey,
    chunked_rows,
    context_bucket,
    context_buckets,
    row_bucket,
)
from tfc.runtime.models.dsv41.fast.step_plan import flatten, plan_tiles
from tfc.runtime.worker.step import SequenceStep, StepPlan


def test_row_buckets_cover_1_to_256_rows_past_16_in_whole_chunks():
    assert [row_bucket(n) for n in range(1, 17)] == [1, 2, 3, 4, 5, 6, 7, 8, 12, 12, 12, 12, 16, 16, 16, 16]
    assert [row_bucket(n) for n in (17, 33, 64, 65, 200, 256)] == [32, 48, 64, 96, 256, 256]
    assert ROW_BUCKETS[-1] == MAX_ROWS == 256
    assert all(b % CHUNK_ROWS == 0 for b in ROW_BUCKETS if b > CHUNK_ROWS)
    assert [chunked_rows(n) for n in (1, 12, 16, 17, 256)] == [16, 16, 16, 32, 256]
    for bad in (0, 257):
        with pytest.raises(ValueError):
            row_bucket(bad)


def test_context_buckets_are_the_spec_list():
    # serving.md section 6: 2,048-token buckets to 32K, then each end x 1.25 rounded up to 2,048; 26 to 300K
    buckets = context_buckets(300_000)
    assert buckets[:16] == tuple(range(2048, 32769, 2048))
    assert buckets[16:22] == (40960, 51200, 65536, 81920, 102400, 129024)
    assert len(buckets) == 26 and buckets[-1] >= 300_000 and buckets[-2] < 300_000
    assert context_bucket(1, buckets) == 2048 and context_bucket(2049, buckets) == 4096
    assert context_buckets(4096, step=256) == tuple(range(256, 4097, 256))
    with pytest.raises(ValueError):
        context_bucket(buckets[-1] + 1, buckets)


def test_a_plan_becomes_steps_holding_at_most_16_rows_of_a_sequence_in_order():
    plan = StepPlan(
        (
            SequenceStep(slot=3, tokens=(7,), position=40),  # a decode row
            SequenceStep(slot=0, tokens=tuple(range(100, 125)), position=0),  # a 25-token prefill chunk
            SequenceStep(slot=5, tokens=(9, 8), position=2047),
        )
    )
    rows = flatten(plan)
    assert len(rows) == 28 and [r.out for r in rows if r.out is not None] == [0, 1, 2]
    assert rows[0].out == 0 and rows[25].out == 1 and rows[27].out == 2 and rows[26].out is None
    assert [r.position for r in rows[1:26]] == list(range(25))
    tiles = plan_tiles(plan, dummy_slot=8, buckets=context_buckets(8192), width=16)
    assert [len(t.rows) for t in tiles] == [16, 12]
    first, second = tiles
    assert first.key == StepKey(16, 2048) and second.key == StepKey(
        12, 4096
    )  # position 2048 needs 2,049 tokens
    assert first.slots.tolist() == [3] + [0] * 15
    assert second.slots.tolist() == [0] * 10 + [5, 5] + [8] * 4  # padding rows: the dummy slot
    assert second.tokens.tolist()[10:] == [9, 8, 0, 0, 0, 0] and second.positions.tolist()[10:] == [
        2047,
        2048,
        0,
        0,
        0,
        0,
    ]
    assert all(len(t.tokens) == 16 for t in tiles)
    wide = plan_tiles(plan, dummy_slot=8, buckets=context_buckets(8192))  # a decode step of up to 256 rows
    assert [len(t.rows) for t in wide] == [1 + SEQ_ROWS, 9 + 2]  # the chunk's 17th row starts the next step
    assert [t.key.rows for t in wide] == [32, 12] and all(len(t.tokens) == MAX_ROWS for t in wide)


def test_many_sequences_share_one_step_up_to_256_rows():
    plan = StepPlan(tuple(SequenceStep(slot=s, tokens=(s,), position=5) for s in range(300)))
    tiles = plan_tiles(plan, dummy_slot=300, buckets=(2048,))
    assert [len(t.rows) for t in tiles] == [256, 44] and [t.key.rows for t in tiles] == [256, 48]
    assert tiles[1].slots.tolist()[:44] == list(range(256, 300))


def test_one_decode_row_is_a_one_row_step():
    tiles = plan_tiles(StepPlan((SequenceStep(1, (5,), 9),)), dummy_slot=2, buckets=(256, 512))
    assert len(tiles) == 1 and tiles[0].key == StepKey(1, 256) and tiles[0].slots.tolist()[:2] == [1, 2]
