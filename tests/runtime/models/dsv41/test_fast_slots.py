"""Slots a fast runner takes when none are asked for: what half the free device memory holds at its context."""

from __future__ import annotations

from tfc.fixtures.tiny import tiny_config
from tfc.packs.deepseek_v41_config import config_from_dict as pack_config
from tfc.runtime.models.dsv41.config import config_from_dict
from tfc.runtime.models.dsv41.fast.build import KV_SHARE, auto_slots
from tfc.runtime.models.dsv41.fast.graph_keys import MAX_ROWS, SEQ_ROWS
from tfc.runtime.models.dsv41.fast.kv.layout import kv_layout
from tfc.runtime.worker.step import DEFAULT_SLOTS

GIB = 1 << 30


def _layout():
    raw = tiny_config()
    return kv_layout(config_from_dict(raw, pack_config(raw).layer_mode_records()), SEQ_ROWS)


def test_slots_fill_the_kv_share_of_free_memory_each_sure_of_its_context():
    layout = _layout()
    context = 4096
    per_slot = layout.bytes_per_slot + layout.bytes_per_token * context
    free = int(40 * per_slot / KV_SHARE) + 1
    assert auto_slots(layout, context, free) == 40
    assert auto_slots(layout, context, int(40 * per_slot / KV_SHARE) - 1) == 39


def test_slots_stay_within_one_step_and_at_least_one():
    layout = _layout()
    assert auto_slots(layout, 4096, 1000 * GIB) == MAX_ROWS == 256
    assert auto_slots(layout, 4096, 0) == 1
    assert auto_slots(layout, 4096, None) == DEFAULT_SLOTS == 16  # no free-memory figure: the CPU
