"""Programmatic dependent launch (PDL): a kernel's launch overlapping the end of the kernel before it (sm_90+).

A decode step is a chain of ~300 small kernels, each reading what the one before wrote. Launched with PDL, a
kernel's programs may be scheduled before the kernel ahead of it has finished; each program's first act is
`wait_prior` (`griddepcontrol.wait`), which returns once that kernel has finished and its writes are visible, so
no load or store of the kernel moves ahead of it and every value is what it was: the same bits, only the launch
gap shortened. A kernel that takes part has a `PDL: tl.constexpr = 0` parameter and calls `wait_prior(PDL)`
before anything else; its launch adds `**pdl_args(device)`.

MODE (env TFC_PDL): "wait" (the default) launches with PDL and waits at the top; "early" also lets the next
kernel start launching at once (`griddepcontrol.launch_dependents` at the top); "off" (TFC_PDL=0) launches
plainly. Off on GPUs before sm_90 and under the interpreter. A process captures its graphs under one mode.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3_tl import INTERPRET
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from tfc.switches import switched_off

__all__ = ["MODES", "mode_of", "pdl_args", "wait_prior"]

MODES = {"off": 0, "wait": 1, "early": 2}


def mode_of(env: dict | None = None) -> str:
    """TFC_PDL's mode: off where switched off, early where "early", else wait."""
    if switched_off("TFC_PDL", env):
        return "off"
    return (
        "early"
        if (os.environ if env is None else env).get("TFC_PDL", "").strip().lower() == "early"
        else "wait"
    )


MODE = mode_of()


@functools.cache
def _capable(index: int) -> bool:
    """Whether CUDA device `index` has grid dependency control (sm_90 and later)."""
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_args(device: torch.device) -> dict:
    """The launch arguments of a participating kernel on `device` under MODE (none where PDL is off)."""
    level = MODES[MODE]
    if not level or INTERPRET or device.type != "cuda":
        return {}
    if not _capable(device.index if device.index is not None else torch.cuda.current_device()):
        return {}
    return {"PDL": level, "launch_pdl": True}


@triton.jit
def wait_prior(PDL: tl.constexpr):
    """Wait for the kernel before to finish (PDL >= 1); let the next start launching (PDL == 2)."""
    if PDL >= 1:
        gdc_wait()
    if PDL >= 2:
        gdc_launch_dependents()
