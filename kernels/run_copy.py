"""Copy runs of words (4, 2 or 1 bytes) from two flat buffers into a third in one launch (a torch reference and a
Triton kernel).

A run is (source word, destination word, words, page words). The first `n_main` runs read `src`, the others `aux`
(a small buffer that came up with the runs themselves: the host-tier restore sends a slot's page-table row that
way). A run with page words p > 0 is paged: its words [c·p, (c+1)·p) land at destination + pages[c]·p, so one run
writes a whole source's entries into a slot's pages, which the kernel reads from `pages` (that same uploaded row).
The restore writes a slot's whole snapshot back like this: one packed buffer in, every KV buffer's rows out, one
launch over a table whose length does not grow with the context.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class CopyConfig:
    """Launch values of the copy (any of them gives the same bytes)."""

    block: int = 1024  # words a program copies an iteration
    per_program: int = 4  # iterations a program takes at most: long runs get more programs


def _check(src: torch.Tensor, dst: torch.Tensor, runs: torch.Tensor, aux: torch.Tensor | None) -> None:
    flat = all(t.dim() == 1 and t.dtype == dst.dtype for t in (src, dst, *(() if aux is None else (aux,))))
    if not flat or dst.element_size() not in (1, 2, 4):
        raise ValueError(f"src, aux and dst must be flat buffers of one 1-, 2- or 4-byte word, got {src.dtype}, "
                         f"{dst.dtype}")  # fmt: skip
    if runs.dtype != torch.int64 or runs.dim() != 2 or runs.shape[0] != 4:
        raise ValueError(f"runs must be int64 [4, n] (source, destination, words, page words), got {runs.dtype} "
                         f"{tuple(runs.shape)}")  # fmt: skip


def _unpaged(runs: torch.Tensor, pages: list[int] | None) -> torch.Tensor:
    """[3, m] plain runs: every paged run cut at its pages, each piece at its page's destination."""
    out = []
    for s, d, n, p in runs.tolist():
        if p <= 0:
            out.append((s, d, n))
            continue
        if pages is None:
            raise ValueError("a paged run needs `pages`")
        out += [(s + c, d + pages[c // p] * p, min(p, n - c)) for c in range(0, n, p)]
    return torch.tensor(out, dtype=torch.int64).reshape(-1, 3).T


def _copy(src: torch.Tensor, dst: torch.Tensor, s: torch.Tensor, d: torch.Tensor, n: torch.Tensor) -> None:
    if not len(n):
        return
    start = torch.cumsum(n, 0) - n
    step = torch.arange(int(n.sum()), device=dst.device) - torch.repeat_interleave(start, n)
    dst[torch.repeat_interleave(d, n) + step] = src[torch.repeat_interleave(s, n) + step]


def copy_runs_reference(src: torch.Tensor, dst: torch.Tensor, runs: torch.Tensor, aux: torch.Tensor | None = None,
                        n_main: int | None = None, pages: torch.Tensor | None = None) -> None:  # fmt: skip
    """dst[d + i] = (src if the run is one of the first n_main, else aux)[s + i] for i < n of every run
    (s, d, n, p), the destination of paged runs (p > 0) moved by pages[i // p] · p, in torch (any device)."""
    _check(src, dst, runs, aux)
    runs, page_ids = runs.cpu(), None if pages is None else pages.tolist()
    n_main = runs.shape[1] if n_main is None else n_main
    for buf, part in ((src, runs[:, :n_main]), (aux, runs[:, n_main:])):
        s, d, n = _unpaged(part.T, page_ids).to(dst.device)
        if len(n):
            _copy(buf, dst, s, d, n)


@triton.jit(do_not_specialize=["n_runs", "n_main"])
def _copy_runs_kernel(src_ptr, aux_ptr, dst_ptr, runs_ptr, pages_ptr, n_runs, n_main, BLOCK: tl.constexpr):
    run, part, parts = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    s = tl.load(runs_ptr + run)
    d = tl.load(runs_ptr + n_runs + run)
    n = tl.load(runs_ptr + 2 * n_runs + run)
    p = tl.load(runs_ptr + 3 * n_runs + run)
    for lo in range(part * BLOCK, n, parts * BLOCK):
        w = lo + tl.arange(0, BLOCK)
        mask = w < n
        if p > 0:
            c = w // p
            to = d + tl.load(pages_ptr + c, mask=mask, other=0) * p + (w - c * p)
        else:
            to = d + w
        if run < n_main:
            v = tl.load(src_ptr + s + w, mask=mask)
        else:
            v = tl.load(aux_ptr + s + w, mask=mask)
        tl.store(dst_ptr + to, v, mask=mask)


def copy_runs_triton(src: torch.Tensor, dst: torch.Tensor, runs: torch.Tensor, longest: int,
                     aux: torch.Tensor | None = None, n_main: int | None = None,
                     pages: torch.Tensor | None = None, config: CopyConfig = CopyConfig()) -> None:  # fmt: skip
    """copy_runs_reference in one launch; `longest` (the largest run's words, known on the host) sizes the grid.
    `runs` and `pages` (int64) must be on dst's device and contiguous."""
    _check(src, dst, runs, aux)
    n_runs = runs.shape[1]
    if n_runs == 0 or longest <= 0:
        return
    parts = max(1, -(-longest // (config.block * config.per_program)))
    n_main = n_runs if n_main is None else n_main
    _copy_runs_kernel[(n_runs, parts)](
        src,
        src if aux is None else aux,
        dst,
        runs,
        runs if pages is None else pages,
        n_runs,
        n_main,
        BLOCK=config.block,
    )


def copy_runs(src: torch.Tensor, dst: torch.Tensor, runs: torch.Tensor, longest: int,
              aux: torch.Tensor | None = None, n_main: int | None = None,
              pages: torch.Tensor | None = None) -> None:  # fmt: skip
    """The kernel on a GPU, the torch reference on the CPU."""
    if dst.device.type == "cuda":
        copy_runs_triton(src, dst, runs, longest, aux, n_main, pages)
    else:
        copy_runs_reference(src, dst, runs, aux, n_main, pages)
