"""What the fast forward keeps per sequence, in bytes: window rings per slot, compressed rows per token (paged).

Per backbone layer and slot, a window ring of `ring` FP8 rows (the last `sliding_window` keys plus room for a
step's rows); per KV-source layer (ratio r), one compressed entry and one indexer key every r tokens, in pages
of `page_tokens` tokens shared by every KV-source layer (page p holds entries [p * page_tokens / r, ...) of
each); per ratio>1 KV source and slot, a small fp32 ring of the compressor's projected rows (a group waits for
its last token). Row formats: kv_rows.py. DeepSeek-V4.1-Flash (TP=1, or per rank at TP=2, both replicate
them): 3 sources at ratio 2 and one at ratio 1, (288 + 68) B per entry, 2.5 entries a token = 890 B per token.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfc.runtime.models.dsv41.config import Dsv41Config
from tfc.runtime.models.dsv41.fast.kv.rows import RowFormat, fp4_entry, fp4_key, fp8_row

PAGE_TOKENS = 256  # tokens a page covers (TensorFold V4.1's KV page)


@dataclass(frozen=True)
class KvSource:
    """One KV-source layer: its compress ratio and whether it keeps indexer keys."""

    layer: int
    ratio: int
    index_keys: bool


@dataclass(frozen=True)
class KvLayout:
    """Row formats, ring sizes and paging of one model's KV memory."""

    layers: int
    window: int
    ring: int  # window rows kept per (layer, slot): window + rows a step may add
    step_rows: int
    page_tokens: int
    window_row: RowFormat
    entry_row: RowFormat
    key_row: RowFormat
    head_dim: int
    sources: tuple[KvSource, ...]

    def entries_per_page(self, ratio: int) -> int:
        """Entries of a ratio-r source in one page."""
        return self.page_tokens // ratio

    def compressor_ring(self, ratio: int) -> int:
        """Projected rows a ratio-r source keeps per slot (a step's rows plus the r - 1 before them)."""
        return self.step_rows + ratio

    @property
    def bytes_per_token(self) -> float:
        """Paged bytes one token adds: every source's entry and indexer key, 1/r of a row each."""
        return sum((self.entry_row.nbytes + (self.key_row.nbytes if s.index_keys else 0)) / s.ratio
                   for s in self.sources)  # fmt: skip

    @property
    def bytes_per_page(self) -> int:
        """Paged bytes of one page, over all sources."""
        return int(self.bytes_per_token * self.page_tokens)

    @property
    def bytes_per_slot(self) -> int:
        """Fixed bytes of one slot: its window rings and its compressor rings (fp32 kv and gate rows)."""
        rings = self.layers * self.ring * self.window_row.nbytes
        pending = sum(
            2 * self.compressor_ring(s.ratio) * self.head_dim * 4 for s in self.sources if s.ratio > 1
        )
        return rings + pending


def kv_layout(cfg: Dsv41Config, step_rows: int, page_tokens: int = PAGE_TOKENS) -> KvLayout:
    """The KV layout of a config for steps of up to `step_rows` rows."""
    sources = tuple(
        KvSource(m.layer, m.compress_ratio, m.is_index_source) for m in cfg.modes if m.mode == "full"
    )
    for s in sources:
        if page_tokens % s.ratio:
            raise ValueError(f"page of {page_tokens} tokens does not hold whole groups of ratio {s.ratio}")
    return KvLayout(
        layers=cfg.num_hidden_layers,
        window=cfg.sliding_window,
        ring=cfg.sliding_window + step_rows,
        step_rows=step_rows,
        page_tokens=page_tokens,
        window_row=fp8_row(cfg.head_dim),
        entry_row=fp4_entry(cfg.head_dim),
        key_row=fp4_key(cfg.index_head_dim),
        head_dim=cfg.head_dim,
        sources=sources,
    )
