"""Rolling a fast-runner slot back inside its last verify step, and why resetting it to a position is enough.

A verify row feeds a slot the rows of positions p .. p+k (the last token and k <= draft_block drafts); the
engine keeps those before some q in [p, p+k+1] and the runner sets the slot back to its first q fed tokens:
position q, the Engram look-back of the tokens before q, the pages past q's given back (their table entries
to the scratch page again). No KV byte is saved or copied back, because from then on no read of the slot can
reach a byte a rejected row (a position in q .. p+k) wrote or overwrote before it is rewritten. With W the
window, S the rows one step may add (the ring holds W + S rows) and r a compress ratio:

1. A row at position s reads data of positions <= s only, at addresses its position fixes: the window ring
   rows of positions (s - W, s] (ring row = position % (W + S)); the compressor ring rows of the group it
   closes, positions s - r + 1 .. s (row = position % (S + r)); the entries and index keys of the groups
   closed by positions <= s, e < (s + 1) // r, through the page table. Everything else a step gathers
   (entries past that count, unmapped pages, a non-closing row's pool) is masked before its value counts:
   scores -inf, values zeroed, or written to the scratch row.
2. Within a layer every row of a step writes its window row, compressor rows and (closing a group) its entry
   and index key before any row reads (attention.py, compressed.py), and no position runs before an earlier
   one. So the data of a position >= q is rewritten by the new row at that position before any read can
   reach it, with the bytes a slot never fed the rejected rows writes (the same token, position and
   reachable state: by induction over the steps).
3. A rejected row at q + j overwrote the window ring row of position q + j - (W + S) and the compressor ring
   row of position q + j - (S + r). Reads from q on reach positions > q - W and >= q - r + 1, which lie above
   both while j <= S (`draft_bound` keeps k below S, so a verify row also fits one step). Its entry and key
   rows are its own group's (closed by a position >= q: point 2) or the scratch row (rows that close none).

The drafter needs no rollback either: it is handed a verify step's target hidden rows only once the engine
says how many it kept. After a rollback the slot's buffers still differ from a never-fed slot's in rows no
read reaches (rejected positions' rows, positions older than the window, entries past the visible count);
tests/runtime/models/dsv41/test_fast_drafting.py checks that every row a read can reach is byte for byte a
never-fed slot's and that the following logits are bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class VerifyMark:
    """A slot's open verify step: its first position, the rows it fed and (drafting) their target hidden rows."""

    position: int
    rows: int
    hidden: torch.Tensor | None = None

    def keep(self, position: int) -> int:
        """Rows a rollback to `position` keeps (ValueError outside the step)."""
        keep = position - self.position
        if not 0 <= keep <= self.rows:
            raise ValueError(
                f"a verify step of {self.rows} rows at position {self.position} cannot go back to {position}"
            )
        return keep


def draft_bound(block: int, window: int, step_rows: int) -> int:
    """The most drafts a verify row may carry for a position reset to be its rollback (module docstring, 3)."""
    return max(0, min(block, window - 1, step_rows - 1))
