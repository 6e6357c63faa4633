#!/usr/bin/env python3
"""Open question: a one-row decode step at its byte floor (issue "One stream at the bandwidth"): what does
programmatic dependent launch (PDL) save a chain of small dependent Triton kernels in a CUDA graph?

    python3 benchmarks/lab/pdl_chain.py --out $OUT/pdl_chain.json

A decode step is ~300 small kernels, each reading what the one before wrote. With PDL (`launch_pdl=True`, sm_90) a
kernel's launch may begin before the kernel before it has finished: each program first waits for it
(`griddepcontrol.wait`, so no read or write moves ahead of it), and a kernel says when the next may start launching
(`griddepcontrol.launch_dependents`, at its top or its end). This chains LINKS kernels (x -> 1.0001 x + 0.5 a value
a link, buffers swapped between links) at one wave and at several waves of programs, captured as one graph, and
times a replay against the same chain without PDL; every variant's result must equal the plain chain's bit for bit.
`mixed`: every fourth link a torch op (no PDL across it), as a step's torch ops interleave the kernels.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import cuda_timed as timed
from _common import ensure_tfc

ensure_tfc()

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: E402

LINKS = 256
BLOCK = 1024
VARIANTS = {
    "plain": (False, False),
    "pdl_top": (True, True),
    "pdl_end": (True, False),
}  # (pdl, early trigger)


@triton.jit
def _link(src, dst, n, PDL: tl.constexpr, EARLY: tl.constexpr, BLOCK: tl.constexpr, WORK: tl.constexpr):
    """dst = src a few multiply-adds on; with PDL nothing is read or written before the kernel before has finished."""
    if PDL:
        gdc_wait()
        if EARLY:
            gdc_launch_dependents()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(src + offs, mask=m)
    for _ in tl.static_range(WORK):
        x = x * 1.0001 + 0.5
    tl.store(dst + offs, x, mask=m)
    if PDL and not EARLY:
        gdc_launch_dependents()


def chain(bufs, n: int, pdl: bool, early: bool, mixed: bool, work: int):
    """The LINKS kernels as one callable (buffers swapped a link)."""
    grid = (triton.cdiv(n, BLOCK),)

    def run():
        for i in range(LINKS):
            src, dst = bufs[i % 2], bufs[(i + 1) % 2]
            if mixed and i % 4 == 3:
                torch.add(src, 0.25, out=dst)
            else:
                _link[grid](src, dst, n, PDL=pdl, EARLY=early, BLOCK=BLOCK, WORK=work, launch_pdl=pdl)
        return bufs[LINKS % 2]

    return run


def measure(programs: int, mixed: bool, work: int) -> dict:
    """Each variant's graph replay per link (µs) and its result's bits against the plain chain's."""
    n = programs * BLOCK
    out, ref = {}, None
    for name, (pdl, early) in VARIANTS.items():
        bufs = [torch.arange(n, dtype=torch.float32, device="cuda") * 1e-3, torch.zeros(n, device="cuda")]
        fn = chain(bufs, n, pdl, early, mixed, work)
        fn()
        torch.cuda.synchronize()
        bufs[0].copy_(torch.arange(n, dtype=torch.float32, device="cuda") * 1e-3)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            res = fn()
        bufs[0].copy_(torch.arange(n, dtype=torch.float32, device="cuda") * 1e-3)
        g.replay()
        torch.cuda.synchronize()
        value = res.clone()
        ref = value if ref is None else ref
        eager = timed(fn, reps=10)
        out[name] = {"graph_us_per_link": timed(g.replay, reps=30) * 1e6 / LINKS,
                     "eager_us_per_link": eager * 1e6 / LINKS, "equal_plain": bool(torch.equal(value, ref))}  # fmt: skip
    base = out["plain"]["graph_us_per_link"]
    for v in out.values():
        v["speedup"] = base / v["graph_us_per_link"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "python": platform.python_version(), "links": LINKS, "cases": {}}  # fmt: skip
    for label, programs, mixed, work in (("one_wave", sms, False, 8), ("small_16", 16, False, 8),
                                         ("four_waves", 4 * sms * 4, False, 8), ("one_wave_mixed", sms, True, 8),
                                         ("one_wave_long", sms, False, 512)):  # fmt: skip
        try:
            res["cases"][label] = measure(programs, mixed, work)
        except Exception as exc:  # keep the other cases
            res["cases"][label] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
        print(label, json.dumps(res["cases"][label]))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
