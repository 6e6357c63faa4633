"""The warm-up before any clock starts: one step of one token, so the decode step's graph is captured (and its
stages compiled) before the first request or the first timed token."""

from __future__ import annotations

from tfc.runtime.worker.step import SequenceStep, StepPlan


def warm_up(steps, bos_id: int | None) -> None:
    """Run one token (the model's BOS, else id 0) at position 0 in slot 0 of `steps` (a worker, or a TP
    world's leader), then release the slot."""
    steps.execute(StepPlan((SequenceStep(0, (bos_id if bos_id is not None else 0,), 0),)))
    steps.release(0)
