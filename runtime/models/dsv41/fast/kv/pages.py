"""The KV page allocator (host side): which pages of the shared pool each slot's tokens live in.

Page 0 is scratch: every unmapped table entry points at it (reads there are masked out, and rows that write no
compressed entry write there). Pages are handed out lowest first and come back on release; nothing on the
device moves, so graphs that baked in the pools stay valid.
"""

from __future__ import annotations

import heapq

from tfc.errors import TfcError


class KvFull(TfcError):
    """A sequence needs a KV page and none is free, or it would pass its slot's token limit."""


class PagePool:
    """`pages` pages of `page_tokens` tokens (plus the scratch page 0) shared by `slots` slots."""

    def __init__(self, pages: int, page_tokens: int, slots: int, tokens_per_slot: int) -> None:
        if pages < 1 or page_tokens < 1 or slots < 1 or tokens_per_slot < 1:
            raise ValueError("a page pool needs at least one page, token, slot and token per slot")
        self.pages = pages
        self.page_tokens = page_tokens
        self.tokens_per_slot = tokens_per_slot
        self.max_pages = -(-tokens_per_slot // page_tokens)
        self._free = list(range(1, pages + 1))
        heapq.heapify(self._free)
        self._tables: list[list[int]] = [[] for _ in range(slots)]

    @property
    def slots(self) -> int:
        """Slots the pool serves."""
        return len(self._tables)

    @property
    def free_pages(self) -> int:
        """Pages not held by any slot."""
        return len(self._free)

    def table(self, slot: int) -> list[int]:
        """The slot's pages in token order (page i holds tokens [i * page_tokens, (i + 1) * page_tokens))."""
        return list(self._tables[slot])

    def ensure(self, slot: int, tokens: int) -> bool:
        """Map pages so the slot holds `tokens` tokens; whether its table changed. KvFull when it cannot."""
        if tokens > self.tokens_per_slot:
            raise KvFull(
                f"slot {slot}: {tokens} tokens pass the {self.tokens_per_slot} tokens a slot may hold"
            )
        table = self._tables[slot]
        need = -(-tokens // self.page_tokens) - len(table)
        if need <= 0:
            return False
        if need > len(self._free):
            raise KvFull(
                f"slot {slot} needs {need} more KV page(s) of {self.page_tokens} tokens; "
                f"{len(self._free)} of {self.pages} are free (start with more KV tokens)"
            )
        table.extend(heapq.heappop(self._free) for _ in range(need))
        return True

    def truncate(self, slot: int, tokens: int) -> bool:
        """Give back the slot's pages past its first `tokens` tokens (a rollback); whether its table changed."""
        table = self._tables[slot]
        keep = -(-max(0, tokens) // self.page_tokens)
        for page in table[keep:]:
            heapq.heappush(self._free, page)
        changed = keep < len(table)
        del table[keep:]
        return changed

    def release(self, slot: int) -> None:
        """Give the slot's pages back (a no-op for an empty slot)."""
        for page in self._tables[slot]:
            heapq.heappush(self._free, page)
        self._tables[slot] = []
