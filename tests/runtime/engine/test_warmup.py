"""warm_up: one prompt token at position 0 in slot 0 (and a decode token after it where prompt rows take a path
of their own; where the runner drafts, one draft after it; with a prefix cache,
its snapshot restored once), then the slot released."""

from __future__ import annotations

from dataclasses import replace

from tfc.runtime.engine.warmup import warm_up
from tfc.runtime.worker.runner import RunnerCapabilities
from tfc.runtime.worker.step import SequenceStep


class _Steps:
    capabilities = RunnerCapabilities()

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
    assert (
        kind == "execute"
        and len(rows) == 1
        and rows[0].slot == 0
        and rows[0].tokens == (7,)
        and rows[0].prompt
    )
    assert rows[0].position == 0 and release == ("release", 0)


def test_warm_up_runs_a_decode_token_too_where_prompt_rows_take_their_own_path():
    steps = _Steps()
    steps.capabilities = RunnerCapabilities(prompt_rows=True)
    warm_up(steps, 7)
    (_, first), (_, second), release = steps.calls
    assert first[0].prompt and (first[0].tokens, first[0].position) == ((7,), 0)
    assert not second[0].prompt and (second[0].tokens, second[0].position) == ((7,), 1)
    assert release == ("release", 0)


def test_warm_up_without_a_bos_feeds_id_0():
    steps = _Steps()
    warm_up(steps, None)
    assert steps.calls[0][1][0].tokens == (0,)


class _Snapshots(_Steps):
    capabilities = RunnerCapabilities(snapshot=True)

    def snapshot(self, slot):
        self.calls.append(("snapshot", slot))
        return "snap"

    def restore(self, slot, snap):
        self.calls.append(("restore", slot, snap))

    def load_snapshot(self, data):
        raise AssertionError("not read at warm-up")


def test_warm_up_restores_the_slots_snapshot_only_for_a_prefix_cache():
    steps = _Snapshots()
    warm_up(steps, 7, snapshots=True)
    assert [c[0] for c in steps.calls] == ["execute", "snapshot", "restore", "release"]
    assert steps.calls[2] == ("restore", 0, "snap")
    steps = _Snapshots()
    warm_up(steps, 7)
    assert [c[0] for c in steps.calls] == ["execute", "release"]
    steps = _Steps()  # a runner without snapshots: the token alone
    warm_up(steps, 7, snapshots=True)
    assert [c[0] for c in steps.calls] == ["execute", "release"]
    steps = _Snapshots()  # the methods without the capability stated: the capability decides
    steps.capabilities = RunnerCapabilities()
    warm_up(steps, 7, snapshots=True)
    assert [c[0] for c in steps.calls] == ["execute", "release"]


class _Drafts(_Steps):
    capabilities = RunnerCapabilities(draft=True)
    draft_block = 5

    def draft(self, asks, choose=None):
        self.calls += [("draft", *ask) for ask in asks]
        return [() for _ in asks]

    def rollback(self, slot, position):
        self.calls.append(("rollback", slot, position))


def test_warm_up_drafts_once_after_the_token_where_the_runner_drafts():
    steps = _Drafts()
    warm_up(steps, 7, draft=True)
    (kind, rows), drafted, *windows, release = steps.calls
    assert (
        kind == "execute" and rows[0].drafting and drafted == ("draft", 0, 7, 5) and release == ("release", 0)
    )
    # a verify window of each draft length, so their steps are captured before any request, each rolled back
    assert windows == [
        c
        for k in range(1, 6)
        for c in (
            ("execute", (SequenceStep(0, (7,) * (k + 1), k, verify=True, drafting=True),)),
            ("rollback", 0, k + 1),
        )
    ]
    steps = _Drafts()
    warm_up(steps, 7)  # drafting off: the token alone, not a drafting row
    assert [c[0] for c in steps.calls] == ["execute", "release"] and not steps.calls[0][1][0].drafting
    steps = _Steps()  # a runner that cannot draft
    warm_up(steps, 7, draft=True)
    assert [c[0] for c in steps.calls] == ["execute", "release"]
    steps = _Drafts()  # a drafter whose runner states no drafting: not asked
    steps.capabilities = replace(steps.capabilities, draft=False)
    warm_up(steps, 7, draft=True)
    assert [c[0] for c in steps.calls] == ["execute", "release"] and not steps.calls[0][1][0].drafting


class _Runner:
    capabilities = RunnerCapabilities(stats=True)

    def __init__(self, kernels):
        self.kernels = kernels

    def stats(self):
        return {"stage_kernels": self.kernels}


def test_stage_kernels_are_counted_where_a_runner_runs_them():
    from tfc.runtime.engine.warmup import stage_kernels, stages_line

    assert stage_kernels(_Runner(15)) == 15 and stages_line(15) == "15 stages as Triton kernels"
    assert stage_kernels(_Runner(0)) == 0 and stage_kernels(_Runner(None)) == 0
    assert stage_kernels(None) == 0 and stage_kernels(_Steps()) == 0


def test_runner_notes_say_how_a_runner_runs():
    from tfc.runtime.engine.warmup import runner_notes

    class Noted(_Runner):
        def stats(self):
            return {"stage_kernels": self.kernels, "notes": ["kernels' torch references (no GPU)"]}

    assert runner_notes(Noted(0)) == ["kernels' torch references (no GPU)"]
    assert runner_notes(_Runner(0)) == [] and runner_notes(None) == [] and runner_notes(_Steps()) == []
