"""A layer's side branch on a second CUDA stream: work that only writes the KV memory runs beside the step's main
line (the queries) and is joined before anything reads what it wrote. A captured step holds the fork and the join.

Only exact decode steps overlap: their EXL3 products are row-free launches, whose sums need no arrival counters
(exl3_launch.counters, which launches on two streams at once must not share; a loose build's launches, `exact=False`, use them);
a prefill step's many-row products are bound by arithmetic, not latency. A tensor-parallel rank stays serial: its
overlap is not measured on several GPUs.
The bits are those of the serial step: every kernel computes the same values from the same inputs, only their
order on the GPU changes.
"""

from __future__ import annotations

from types import TracebackType

import torch


def side_stream(f, x: torch.Tensor) -> torch.cuda.Stream | None:
    """The forward's side stream on x's GPU where the step is an exact decode step at TP=1; else None."""
    serial = f.tp is not None or getattr(f.ops, "many_rows", False)
    if not (x.is_cuda and f.ops.exact) or serial:
        return None
    if f.side is None:
        f.side = torch.cuda.Stream(x.device)
    return f.side


class SideBranch:
    """`with branch:` runs its work on the side stream, forked from the current stream at entry; `join()` makes the
    current stream wait for it. Without a side stream the work runs inline and `join()` does nothing."""

    def __init__(self, f, x: torch.Tensor) -> None:
        self.stream = side_stream(f, x)
        self.main = torch.cuda.current_stream(x.device) if self.stream is not None else None
        self._context = torch.cuda.stream(self.stream) if self.stream is not None else None

    def __enter__(self) -> SideBranch:
        if self.stream is not None:
            self.stream.wait_stream(self.main)
            self._context.__enter__()
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if self._context is not None:
            self._context.__exit__(kind, error, trace)

    def join(self) -> None:
        """The current stream waits for the branch's work (nothing inline)."""
        if self.stream is not None:
            self.main.wait_stream(self.stream)


__all__ = ["SideBranch", "side_stream"]
