"""The fast forward's small-op stages fused on a GPU: each `@fused` function runs as the plain Triton kernel named
for it (`kernel=`, on CUDA tensors unless TFC_STAGE_KERNELS=0), else torch.compile'd (a few Triton kernels where
eager launches dozens: the mHC's Sinkhorn alone is ~120 per site), or as written. With the kernels nothing
compiles, so a restart imports none of torch.compile's stack.

A stage kernel (tfc.kernels.*) takes the stage's own arguments and is imported on its first call; it replaces
the stage in every mode, so a process runs one code for the stage throughout (graph == eager as below). Under
the CPU interpreter `use_kernels("all")` runs them on CPU tensors too (the tests of the whole forward).

Compiling is off by default and on the CPU; `build_fast` turns it on for a CUDA arena when the stage kernels are
off (TFC_STAGE_KERNELS=0), unless TFC_COMPILE=0 (then the stages run as written). A stage compiles
the first time it runs (the eager warm-up before a graph capture), once per input shape (dynamic=False: a
step's shapes depend on its key only), except in the dimensions it names dynamic: the indexer's entries follow
the context bucket, so they compile once as a symbol and a step reaching a new bucket compiles nothing. A stage
that fails to compile runs eagerly from then on, named in `NOTES`.
Compiled and eager code may round differently, so graph == eager holds because both run the same one; but a
cast is a cast: inductor keeps every dtype round trip as eager rounds it (`emulate_precision_casts`), since
without it a fused `x.to(bf16).float()` stays x and the router's three-part split of x collapses to its first
part (the router's product then carries bf16 error, enough to flip expert picks).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tfc.switches import switched_off

_STATE: dict[str, Any] = {"on": False, "stages": None, "kernels": "off"}
NOTES: list[str] = []
# Compiles of the process by how they came: loaded from the stage folder, compiled and saved there, or traced
# by torch.compile in process (no folder, or a stage that could not be saved); and the stages run as kernels.
COUNTS = {"loaded": 0, "saved": 0, "traced": 0, "kernels": 0}


def wanted(device_type: str, env: dict[str, str] | None = None) -> bool:
    """Whether stages should compile on this device (CUDA, unless TFC_COMPILE=0 or the stage kernels run: every
    stage has one, so nothing would be left to compile)."""
    return device_type == "cuda" and not switched_off("TFC_COMPILE", env) and not kernels_wanted(env)


def enable(on: bool) -> None:
    """Turn compiled stages on or off for the process (they are module-level functions)."""
    if on and not _STATE["on"]:
        import torch._dynamo
        import torch._inductor.config

        torch._inductor.config.emulate_precision_casts = True
        # torch 2.11 (the H200's) leaves it off: no aot_compile, so no stage could be saved
        if hasattr(torch._dynamo.config, "enable_aot_compile"):
            torch._dynamo.config.enable_aot_compile = True

        for name in ("recompile_limit", "cache_size_limit"):  # one entry per context bucket a stage meets
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
    _STATE["on"] = on


def kernels_wanted(env: dict[str, str] | None = None) -> bool:
    """Whether stages with a Triton kernel run it on CUDA tensors (the default; TFC_STAGE_KERNELS=0: the
    compiled stages instead)."""
    return not switched_off("TFC_STAGE_KERNELS", env)


def use_kernels(where: str) -> None:
    """Where stage kernels run: "cuda" (CUDA tensors), "all" (any tensors: the CPU interpreter) or "off"."""
    if where not in ("cuda", "all", "off"):
        raise ValueError(f"stage kernels run on 'cuda', 'all' or 'off', not {where!r}")
    _STATE["kernels"] = where
    _KERNELS.clear()  # imported again: the interpreter's modules differ from the native ones


_KERNELS: dict[str, Callable[..., Any]] = {}


def _kernel(path: str | None, args: tuple, kwargs: dict) -> Callable[..., Any] | None:
    """The stage kernel `module:function` for this call, or None (no kernel, kernels off, not on CUDA)."""
    where = _STATE["kernels"]
    if path is None or where == "off":
        return None
    if where == "cuda":
        first = next((a for a in args if hasattr(a, "is_cuda")), None)
        if first is None or not first.is_cuda:
            return None
    if path not in _KERNELS:
        import importlib

        module, name = path.split(":")
        _KERNELS[path] = getattr(importlib.import_module(module), name)
        COUNTS["kernels"] += 1
    return _KERNELS[path]


def stage_kernel(path: str, tensor: Any) -> Callable[..., Any] | None:
    """The Triton kernel `module:function` where stage kernels run on `tensor`'s device, else None: for a
    step that reads its inputs another way with a kernel than its stage as written does (the same bits)."""
    return _kernel(path, (tensor,), {})


@contextlib.contextmanager
def eager() -> Iterator[None]:
    """Compile no stage inside the block, whatever `enable` said (restored after it); a stage kernel still runs
    where kernels run."""
    was = _STATE["on"]
    _STATE["on"] = False
    try:
        yield
    finally:
        _STATE["on"] = was


def fused(
    fn: Callable[..., Any] | None = None, *, dynamic: dict[str, int] | None = None, kernel: str | None = None
) -> Callable[..., Any]:
    """fn, run as its Triton `kernel` ("module:function", the same signature) where kernels run, else compiled
    while fusion is on. `dynamic` {parameter: dim}: that dimension of that tensor argument is compiled as a
    symbol, not a constant (the entries of a context bucket), so one compile serves every bucket instead of
    one each the first time a step reaches it."""
    if fn is None:
        return lambda f: fused(f, dynamic=dynamic, kernel=kernel)
    held: dict[str, Any] = {}
    where = _positions(fn, dynamic or {})

    dims = {index: dim for index, dim in where.values()} | {name: dim for name, (_, dim) in where.items()}

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        stage_kernel = _kernel(kernel, args, kwargs)
        if stage_kernel is not None:
            return stage_kernel(*args, **kwargs)
        if not _STATE["on"] or held.get("failed"):
            return fn(*args, **kwargs)
        import torch

        saved = _saved(fn, held, where, dims, args, kwargs)
        if saved is not None:
            try:
                return saved(*args, **kwargs)
            except Exception as error:  # its guards refuse the call, or its code fails: compile in process
                _off(fn, held, error)
        if "compiled" not in held:
            held["compiled"] = torch.compile(fn, dynamic=False, fullgraph=True)
            COUNTS["traced"] += 1
        _mark(where, args, kwargs)
        try:
            return held["compiled"](*args, **kwargs)
        except Exception as error:  # a stage dynamo or inductor cannot take: eager from now on
            held["failed"] = True
            NOTES.append(
                f"{fn.__qualname__} runs eagerly: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            )
            return fn(*args, **kwargs)

    run.stage_kernel, run.stage_fn = kernel, fn
    return run


def use_stage_folder(folder: Path | None) -> None:
    """Where compiled stages are saved and loaded (stage_cache.py); None: torch.compile in every process."""
    _STATE["stages"] = folder


def _mark(where: dict[str, tuple[int, int]], args: tuple, kwargs: dict) -> None:
    """Mark the dynamic dimensions of a call's tensors for torch.compile."""
    import torch

    for name, (index, dim) in where.items():
        t = kwargs.get(name, args[index] if index < len(args) else None)
        if isinstance(t, torch.Tensor):
            torch._dynamo.maybe_mark_dynamic(t, dim)


def _saved(fn: Callable[..., Any], held: dict, where: dict, dims: dict, args: tuple,
           kwargs: dict) -> Callable[..., Any] | None:  # fmt: skip
    """The stage compiled for this call's signature, loaded from or saved into the stage folder; None without
    one (or once that failed for this stage). Only its compile sees the dynamic marks: a saved stage's guards
    refuse marked tensors, and its symbolic dimensions take any size unmarked."""
    from tfc.runtime.models.dsv41.fast.stage_cache import call_key, load_or_compile

    folder = _STATE.get("stages")
    if folder is None or held.get("unsaved"):
        return None
    try:
        key = call_key(args, kwargs, dims)
        stages = held.setdefault("saved", {})
        if key not in stages:
            stages[key], how = load_or_compile(
                folder, fn, args, kwargs, key, lambda: _mark(where, args, kwargs)
            )
            COUNTS[how] += 1
        return stages[key]
    except Exception as error:  # an argument that keys nothing, or an ahead compile torch cannot do
        _off(fn, held, error)
        return None


def _off(fn: Callable[..., Any], held: dict, error: Exception) -> None:
    """Stop using saved compiles for this stage, and say why."""
    held["unsaved"] = True
    NOTES.append(f"{fn.__qualname__} compiles in process: saved stage failed: {type(error).__name__}: "
                 f"{' '.join(str(error).split())[:300]}")  # fmt: skip


def _positions(fn: Callable[..., Any], dynamic: dict[str, int]) -> dict[str, tuple[int, int]]:
    """{parameter: (its position, the dynamic dim)} of fn's parameters named in `dynamic`."""
    names = list(inspect.signature(fn).parameters)
    missing = sorted(set(dynamic) - set(names))
    if missing:
        raise TypeError(f"{fn.__qualname__} has no parameters {missing} to make dynamic")
    return {name: (names.index(name), dim) for name, dim in dynamic.items()}
