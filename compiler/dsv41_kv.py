"""The bytes of a DeepSeek-V4.1 fast forward's KV memory for given slots and context, from the config alone.

Stdlib only: the compiler may not import the runtime, so this mirrors runtime/models/dsv41/fast/kv_memory.py's
one allocation (window rings per slot, paged FP4 entries and indexer keys, compressor rings, the page table,
every buffer rounded up to 256 bytes); a test keeps the two equal. TP ranks each hold all of it.
"""

from __future__ import annotations

STEP_ROWS = 16  # rows one sequence puts in a decode step (the runtime's SEQ_ROWS): a ring keeps this many past the window
PAGE_TOKENS = 256  # tokens a KV page covers (the runtime's PAGE_TOKENS)
BASE_ALIGN = 256  # every buffer's offset in the one allocation


def _up(nbytes: int) -> int:
    return -(-nbytes // BASE_ALIGN) * BASE_ALIGN


def kv_bytes(
    cfg,
    slots: int,
    context: int,
    kv_tokens: int | None = None,
    table_tokens: int | None = None,
    step_rows: int = STEP_ROWS,
    page_tokens: int = PAGE_TOKENS,
) -> int:
    """Bytes the KV memory allocates for `slots` slots of `context` tokens (a pool of slots x context by default)."""
    kv_tokens = slots * context if kv_tokens is None else kv_tokens
    table_tokens = context if table_tokens is None else table_tokens
    head, index_head = cfg.head_dim, cfg.index_head_dim
    window_row = head + head // 32  # fp8 values, a UE8M0 scale per 32
    entry_row = head // 2 + head // 16  # fp4 codes, an e4m3 scale per 16
    key_row = index_head // 2 + index_head // 32  # fp4 codes, a UE8M0 scale per 32
    pages = max(1, -(-kv_tokens // page_tokens))
    width = max(-(-context // page_tokens), -(-table_tokens // page_tokens))
    total = _up(cfg.num_hidden_layers * (slots + 1) * (cfg.sliding_window + step_rows) * window_row)
    total += _up((slots + 1) * width * 8)
    for layer in range(cfg.num_hidden_layers):
        mode = cfg.layer_mode(layer)
        if mode.mode != "full":
            continue
        rows = (pages + 1) * (page_tokens // mode.compress_ratio)
        total += _up(rows * entry_row)
        if mode.is_index_source:
            total += _up(rows * key_row)
        if mode.compress_ratio > 1:
            total += _up(2 * (slots + 1) * (step_rows + mode.compress_ratio) * head * 4)
    return total
