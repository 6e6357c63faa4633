"""A scripted drafter the drafting tests share: it proposes known continuations, with planted errors."""

from __future__ import annotations

import itertools

from support.slot_drafters import OneAtATime

ERRORS = (0, 2, None, 1, 4, None, 3)  # where each round's draft goes wrong (None: nowhere)


class Scripted(OneAtATime):
    """A drafter that proposes the serial continuation of sequences it was given, with planted errors."""

    block_size = 5
    target_layers = ()

    def __init__(self, runs: list[tuple[int, ...]], vocab: int, errors=ERRORS) -> None:
        self.runs, self.vocab, self.errors = runs, vocab, itertools.cycle(errors)
        self.proposed = 0

    def commit(self, slot, position, hidden) -> None:
        raise AssertionError("a drafter without target layers is given no rows")

    def propose_one(self, slot, tokens, last_token, k) -> tuple[int, ...]:
        seen = (*tokens, last_token)
        for run in self.runs:
            if run[: len(seen)] == seen:
                draft = list(run[len(seen) : len(seen) + k])
                wrong = next(self.errors)
                if wrong is not None and wrong < len(draft):
                    draft[wrong] = (draft[wrong] + 1) % self.vocab
                self.proposed += 1
                return tuple(draft)
        return ()

    def release(self, slot) -> None:
        pass
