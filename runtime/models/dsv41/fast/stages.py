"""The fast forward's small-op stages: each `@fused` stage runs as its plain Triton kernel on CUDA tensors and as
written elsewhere (the torch code the kernels are tested against), one code a device.

A stage kernel (tfc.kernels.dsv41.*) takes the stage's own arguments and is imported on its first call, so a
process runs one code for a stage throughout (graph == eager). Nothing is compiled by torch: a restart loads the
kernels from Triton's cache in the image store (runtime/boot/kernel_cache.py). Under the CPU interpreter
`use_kernels("all")` runs the kernels on CPU tensors too (the tests of the whole forward).
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

_WHERE = {"kernels": "cuda"}
_KERNELS: dict[str, Callable[..., Any]] = {}


def use_kernels(where: str) -> None:
    """Where stage kernels run: "cuda" (CUDA tensors, the default) or "all" (any tensors: the CPU interpreter)."""
    if where not in ("cuda", "all"):
        raise ValueError(f"stage kernels run on 'cuda' or 'all', not {where!r}")
    _WHERE["kernels"] = where
    _KERNELS.clear()  # imported again: the interpreter's modules differ from the native ones


def kernels_loaded() -> int:
    """The stage kernels this process has imported since kernels last moved (the boot line counts them)."""
    return len(_KERNELS)


def _kernel(path: str, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
    """The stage kernel `module:function` for a call with these arguments, or None (not on CUDA)."""
    if _WHERE["kernels"] == "cuda":
        first = next((a for a in args if hasattr(a, "is_cuda")), None)
        if first is None or not first.is_cuda:
            return None
    if path not in _KERNELS:
        module, name = path.split(":")
        _KERNELS[path] = getattr(importlib.import_module(module), name)
    return _KERNELS[path]


def stage_kernel(path: str, tensor: Any) -> Callable[..., Any] | None:
    """The Triton kernel `module:function` where stage kernels run on `tensor`'s device, else None: for a
    step that reads its inputs another way with a kernel than its stage as written does (the same bits)."""
    return _kernel(path, (tensor,), {})


def fused(fn: Callable[..., Any] | None = None, *, kernel: str) -> Callable[..., Any]:
    """fn, run as its Triton `kernel` ("module:function", the same signature) where stage kernels run, else as
    written."""
    if fn is None:
        return lambda f: fused(f, kernel=kernel)

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        stage_kernel = _kernel(kernel, args, kwargs)
        if stage_kernel is not None:
            return stage_kernel(*args, **kwargs)
        return fn(*args, **kwargs)

    run.stage_kernel, run.stage_fn = kernel, fn
    return run
