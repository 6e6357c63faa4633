"""When a sequence drafts: a round after every step while its drafts are kept, fewer while they are not.

After a round that kept no draft a sequence waits twice as many serial steps as before (1, 2, 4 .. MAX_WAIT)
before its next round; a round that kept any draft resets the wait to none. A drafter that never agrees (a
model with random weights, text it cannot predict) then costs one round every MAX_WAIT steps instead of a
round every step. Only speed depends on it: a step's tokens are serial decoding's either way.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_WAIT = 16


@dataclass
class DraftBackoff:
    """A sequence's wait before its next draft-verify round."""

    wait: int = 0  # serial steps still to go before the next round
    span: int = 0  # the wait the last rejected round set

    def ready(self) -> bool:
        """Whether this step may draft (a step that may not counts down the wait)."""
        if self.wait > 0:
            self.wait -= 1
            return False
        return True

    def after(self, accepted: int) -> None:
        """Record a round that kept `accepted` drafts."""
        self.span = 0 if accepted else min(MAX_WAIT, max(1, 2 * self.span))
        self.wait = self.span
