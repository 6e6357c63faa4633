"""The fast forward's small-op stages fused on a GPU: each `@fused` function runs torch.compile'd (a few Triton
kernels where eager launches dozens: the mHC's Sinkhorn alone is ~120 per site), or as written.

Off by default and on the CPU; `build_fast` turns it on for a CUDA arena unless TFC_COMPILE=0. A stage compiles
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

import functools
import inspect
import os
from collections.abc import Callable
from typing import Any

_STATE = {"on": False}
NOTES: list[str] = []


def wanted(device_type: str, env: dict[str, str] | None = None) -> bool:
    """Whether stages should compile on this device (CUDA, unless TFC_COMPILE=0)."""
    env = os.environ if env is None else env
    return device_type == "cuda" and env.get("TFC_COMPILE", "1").strip().lower() not in (
        "0",
        "off",
        "false",
        "no",
    )


def enable(on: bool) -> None:
    """Turn compiled stages on or off for the process (they are module-level functions)."""
    if on and not _STATE["on"]:
        import torch._dynamo
        import torch._inductor.config

        torch._inductor.config.emulate_precision_casts = True

        for name in ("recompile_limit", "cache_size_limit"):  # one entry per context bucket a stage meets
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 64))
    _STATE["on"] = on


def fused(
    fn: Callable[..., Any] | None = None, *, dynamic: dict[str, int] | None = None
) -> Callable[..., Any]:
    """fn, run compiled while fusion is on. `dynamic` {parameter: dim}: that dimension of that tensor argument
    is compiled as a symbol, not a constant (the entries of a context bucket), so one compile serves every
    bucket instead of one each the first time a step reaches it."""
    if fn is None:
        return lambda f: fused(f, dynamic=dynamic)
    held: dict[str, Any] = {}
    where = _positions(fn, dynamic or {})

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not _STATE["on"] or held.get("failed"):
            return fn(*args, **kwargs)
        import torch

        if "compiled" not in held:
            held["compiled"] = torch.compile(fn, dynamic=False, fullgraph=True)
        for name, (index, dim) in where.items():
            t = kwargs.get(name, args[index] if index < len(args) else None)
            if isinstance(t, torch.Tensor):
                torch._dynamo.maybe_mark_dynamic(t, dim)
        try:
            return held["compiled"](*args, **kwargs)
        except Exception as error:  # a stage dynamo or inductor cannot take: eager from now on
            held["failed"] = True
            NOTES.append(
                f"{fn.__qualname__} runs eagerly: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            )
            return fn(*args, **kwargs)

    return run


def _positions(fn: Callable[..., Any], dynamic: dict[str, int]) -> dict[str, tuple[int, int]]:
    """{parameter: (its position, the dynamic dim)} of fn's parameters named in `dynamic`."""
    names = list(inspect.signature(fn).parameters)
    missing = sorted(set(dynamic) - set(names))
    if missing:
        raise TypeError(f"{fn.__qualname__} has no parameters {missing} to make dynamic")
    return {name: (names.index(name), dim) for name, dim in dynamic.items()}
