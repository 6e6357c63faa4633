"""Copy runs of words (4, 2 or 1 bytes) from one flat buffer into another in one launch (a torch reference and a Triton kernel).

A run is (source word, destination word, words). The host-tier restore writes a slot's whole snapshot back
this way: one packed buffer in, every KV buffer's rows out, one launch where per-tensor copies take ~20.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024  # words a program copies per iteration
PER_PROGRAM = 4  # iterations a program takes at most: long runs get more programs


def _check(src: torch.Tensor, dst: torch.Tensor, runs: torch.Tensor) -> None:
    if src.dtype != dst.dtype or src.element_size() not in (1, 2, 4) or src.dim() != 1 or dst.dim() != 1:
        raise ValueError(
            f"src and dst must be flat buffers of one 1-, 2- or 4-byte word, got {src.dtype}, {dst.dtype}"
        )
    if runs.dtype != torch.int64 or runs.dim() != 2 or runs.shape[0] != 3:
        raise ValueError(
            f"runs must be int64 [3, n] (source, destination, words), got {runs.dtype} {tuple(runs.shape)}"
        )


def copy_runs_reference(src: torch.Tensor, dst: torch.Tensor, runs: torch.Tensor) -> None:
    """dst[d : d + n] = src[s : s + n] for every run (s, d, n), in torch (any device)."""
    _check(src, dst, runs)
    s, d, n = runs.to(dst.device)
    if not len(n):
        return
    start = torch.cumsum(n, 0) - n
    step = torch.arange(int(n.sum()), device=dst.device) - torch.repeat_interleave(start, n)
    dst[torch.repeat_interleave(d, n) + step] = src[torch.repeat_interleave(s, n) + step]


@triton.jit
def _copy_runs_kernel(src_ptr, dst_ptr, runs_ptr, n_runs, BLOCK: tl.constexpr):
    run, part, parts = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    s = tl.load(runs_ptr + run)
    d = tl.load(runs_ptr + n_runs + run)
    n = tl.load(runs_ptr + 2 * n_runs + run)
    for lo in range(part * BLOCK, n, parts * BLOCK):
        w = lo + tl.arange(0, BLOCK)
        mask = w < n
        tl.store(dst_ptr + d + w, tl.load(src_ptr + s + w, mask=mask), mask=mask)


def copy_runs_triton(src: torch.Tensor, dst: torch.Tensor, runs: torch.Tensor, longest: int) -> None:
    """copy_runs_reference in one launch; `longest` (the largest run's words, known on the host) sizes the grid.
    `runs` must be on dst's device and contiguous."""
    _check(src, dst, runs)
    if runs.shape[1] == 0 or longest <= 0:
        return
    parts = max(1, -(-longest // (BLOCK * PER_PROGRAM)))
    _copy_runs_kernel[(runs.shape[1], parts)](src, dst, runs, runs.shape[1], BLOCK=BLOCK)


def copy_runs(src: torch.Tensor, dst: torch.Tensor, runs: torch.Tensor, longest: int) -> None:
    """The kernel on a GPU, the torch reference on the CPU."""
    if dst.device.type == "cuda":
        copy_runs_triton(src, dst, runs, longest)
    else:
        copy_runs_reference(src, dst, runs)
