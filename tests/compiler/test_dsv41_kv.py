"""The compiler's stdlib KV sizing equals what the runtime's KvMemory allocates, byte for byte."""

from __future__ import annotations

import pytest
import torch
from tfc.compiler.dsv41_kv import PAGE_TOKENS, STEP_ROWS, kv_bytes
from tfc.fixtures.flash_headers import flash_config
from tfc.fixtures.flash_random import random_config
from tfc.fixtures.tiny import tiny_config
from tfc.packs.deepseek_v41_config import config_from_dict as pack_config
from tfc.runtime.models.dsv41.config import config_from_dict
from tfc.runtime.models.dsv41.fast.graph_keys import SEQ_ROWS, context_buckets
from tfc.runtime.models.dsv41.fast.kv import layout as runtime_layout
from tfc.runtime.models.dsv41.fast.kv.memory import KvMemory


def test_the_constants_are_the_runtimes():
    assert STEP_ROWS == SEQ_ROWS and PAGE_TOKENS == runtime_layout.PAGE_TOKENS


@pytest.mark.parametrize(
    "raw", [flash_config(), tiny_config(), random_config(6)], ids=["flash", "tiny", "random6"]
)
@pytest.mark.parametrize(
    ("slots", "context", "kv_tokens", "page_tokens"),
    [
        (1, 1, None, 256),
        (3, 1000, None, 256),
        (16, 4096, None, 256),
        (5, 3000, 7000, 256),
        (2, 300, None, 64),
    ],
)
def test_kv_bytes_equal_the_runtimes_allocation(raw, slots, context, kv_tokens, page_tokens):
    pack = pack_config(raw)
    cfg = config_from_dict(raw, pack.layer_mode_records())
    table = context_buckets(context)[-1]  # what the fast runner sizes its page table for
    layout = runtime_layout.kv_layout(cfg, SEQ_ROWS, page_tokens)
    tokens = slots * context if kv_tokens is None else kv_tokens
    kv = KvMemory(layout, slots, tokens, context, table, torch.device("cpu"))
    assert kv_bytes(pack, slots, context, kv_tokens, table, page_tokens=page_tokens) == kv.base.numel()
