"""fast/overlap.py's gate: which steps write their KV rows on a side stream (the GPU test checks the bits)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from tfc.runtime.models.dsv41.fast import overlap


def _forward(exact: bool = True, many_rows: bool = False, tp: object = None) -> SimpleNamespace:
    return SimpleNamespace(ops=SimpleNamespace(exact=exact, many_rows=many_rows), side=None, tp=tp)


def test_the_side_branch_runs_inline_off_the_gpu():
    x = torch.zeros(2, 3)
    f = _forward()
    assert overlap.side_stream(f, x) is None
    ran = []
    with overlap.SideBranch(f, x) as branch:
        ran.append(x.sum())
    branch.join()
    assert ran and f.side is None


def test_only_exact_decode_steps_at_tp1_overlap():
    gpu = SimpleNamespace(
        is_cuda=True, device="cuda"
    )  # never reaches a stream: each forward below is refused
    assert overlap.side_stream(_forward(exact=False), gpu) is None  # its launches share arrival counters
    assert overlap.side_stream(_forward(many_rows=True), gpu) is None  # a prefill step
    assert overlap.side_stream(_forward(tp=object()), gpu) is None  # a tensor-parallel rank
