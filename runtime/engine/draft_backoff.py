"""When a sequence drafts: a round after every step while its drafts are kept, fewer while they are not.

After a round that kept no draft a sequence waits twice as many serial steps as before (1, 2, 4 .. MAX_WAIT)
before its next round; a round that kept any draft resets the wait to none. A drafter that never agrees (a
model with random weights, text it cannot predict) then costs one round every MAX_WAIT steps instead of a
round every step. Across sequences, `DraftGate` stops rounds altogether while the last ROUNDS rounds (of any
sequence) kept almost nothing, but for one probing round every PROBE_STEPS steps, so a new sequence does not
pay its own rejected rounds first. Only speed depends on either: a step's tokens are serial decoding's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

MAX_WAIT = 16
ROUNDS = 16  # the rounds DraftGate judges by
KEPT_FLOOR = 0.125  # of them, the share that must keep a draft (2 of 16) for rounds to go on
PROBE_STEPS = 64  # while closed, the steps between probing rounds


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


@dataclass
class DraftGate:
    """Whether the drafter lately earns its rounds, over every sequence: open while ROUNDS rounds have not been
    seen or enough of them kept a draft; closed, it lets one step in PROBE_STEPS draft to see again."""

    kept: deque = field(default_factory=lambda: deque(maxlen=ROUNDS))  # per recent round: it kept a draft
    closed_steps: int = 0  # steps drafted none since it closed

    def open(self) -> bool:
        """Whether this step may draft (called once a step)."""
        if len(self.kept) < ROUNDS or sum(self.kept) >= KEPT_FLOOR * ROUNDS:
            self.closed_steps = 0
            return True
        self.closed_steps += 1
        return self.closed_steps % PROBE_STEPS == 0

    def after(self, accepted: int) -> None:
        """Record a round that kept `accepted` drafts."""
        self.kept.append(accepted > 0)
