"""warm_up: one token at position 0 in slot 0, then the slot released."""

from __future__ import annotations

from tfc.runtime.engine.warmup import warm_up


class _Steps:
    def __init__(self):
        self.calls = []

    def execute(self, plan):
        self.calls.append(("execute", plan.rows))

    def release(self, slot):
        self.calls.append(("release", slot))


def test_warm_up_runs_one_bos_token_then_releases_the_slot():
    steps = _Steps()
    warm_up(steps, 7)
    (kind, rows), release = steps.calls
    assert kind == "execute" and len(rows) == 1 and rows[0].slot == 0 and rows[0].tokens == (7,)
    assert rows[0].position == 0 and release == ("release", 0)


def test_warm_up_without_a_bos_feeds_id_0():
    steps = _Steps()
    warm_up(steps, None)
    assert steps.calls[0][1][0].tokens == (0,)
