"""The warm-up before any clock starts: a one-token prompt (and a decode token where prompts take a path of their
own), so the prefill step and the decode step's graph are captured (and their kernels compiled) before the first
request or the first timed token; where the runner drafts, one draft after it (the drafter's kernels compiled, its
graph captured) and a verify window of every draft length, each rolled back (their steps' graphs captured:
otherwise the first drafting requests, and every `tfc generate`, capture them mid-decode); with a prefix cache,
that slot's snapshot restored once, so the first cache hit compiles nothing either."""

from __future__ import annotations

from tfc.runtime.worker.runner import DraftAsk, ModelRunner, drafter_of, snapshots_of, stats_of
from tfc.runtime.worker.step import SequenceStep, StepPlan


def warm_up(steps: ModelRunner, bos_id: int | None, snapshots: bool = False, draft: bool = False) -> None:
    """Run one prompt token (the model's BOS, else id 0) at position 0 in slot 0 of `steps` (a worker, or a TP
    world's leader), then, where prompt rows take a path of their own (capability `prompt_rows`), one decode
    token too; with `draft`, draft after them where the runner can and verify a window of each draft length, each
    rolled back; with `snapshots`, snapshot the slot and restore it in place where the runner can; then release
    the slot."""
    token = bos_id if bos_id is not None else 0
    drafts = drafter_of(steps) if draft else None
    steps.execute(StepPlan((SequenceStep(0, (token,), 0, drafting=drafts is not None, prompt=True),)))
    position = 1
    if steps.capabilities.prompt_rows:
        steps.execute(StepPlan((SequenceStep(0, (token,), 1, drafting=drafts is not None),)))
        position = 2
    if drafts is not None:
        drafts.draft([DraftAsk(0, token, drafts.draft_block)])
        for k in range(1, drafts.draft_block + 1):  # the last token and k drafts
            window = (token,) * (k + 1)
            steps.execute(StepPlan((SequenceStep(0, window, position, verify=True, drafting=True),)))
            position += 1  # the last token kept, the drafts rolled back
            drafts.rollback(0, position)
    saved = snapshots_of(steps) if snapshots else None
    if saved is not None:
        saved.restore(0, saved.snapshot(0))
    steps.release(0)


def stage_kernels(runner: ModelRunner | None) -> int:
    """How many small-op stages a runner ran as Triton kernels (the fast forward's on a GPU; 0 elsewhere)."""
    return int(stats_of(runner).get("stage_kernels") or 0)


def runner_notes(runner: ModelRunner | None) -> list[str]:
    """What a runner says of how it runs (its kernels' stand-ins, a kernel path not taken)."""
    return list(stats_of(runner).get("notes") or ())


def stages_line(kernels: int) -> str:
    """The boot log's line for stage_kernels."""
    return f"{kernels} stages as Triton kernels"
