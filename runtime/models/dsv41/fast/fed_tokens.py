"""The token ids a fast-runner slot was fed: a restored prefix kept as it came (a snapshot's tuple, not copied)
and the ids fed after it, read as one sequence."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from itertools import chain


class FedTokens(Sequence[int]):
    """`prefix` (kept, never copied) followed by the ids appended since; cut back by `truncate`."""

    def __init__(self, prefix: Sequence[int] = ()) -> None:
        self._prefix = prefix
        self._more: list[int] = []

    def __len__(self) -> int:
        return len(self._prefix) + len(self._more)

    def __getitem__(self, index):  # an id, or a slice as a list
        n = len(self._prefix)
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return [self[i] for i in range(start, stop, step)]
            head = list(self._prefix[start:stop]) if start < n else []
            return head + self._more[max(0, start - n) : max(0, stop - n)]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError("token index out of range")
        return self._prefix[i] if i < n else self._more[i - n]

    def __iter__(self) -> Iterator[int]:
        return chain(self._prefix, self._more)

    def append(self, token: int) -> None:
        """Feed one more id."""
        self._more.append(token)

    def truncate(self, length: int) -> None:
        """Keep the first `length` ids."""
        n = len(self._prefix)
        if length >= n:
            del self._more[length - n :]
        else:
            self._prefix, self._more = self._prefix[:length], []
