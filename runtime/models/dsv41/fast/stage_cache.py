"""Compiled stages kept on disk: each fused stage (fusion.py) compiled ahead for one call signature and saved,
so a restart loads it instead of tracing it again.

torch's `aot_compile` traces and compiles a stage for the example call and `save_compiled_function` writes it
out; `load_compiled_function` brings it back with its guards and no tracing. A file is named by the stage, the
call's signature (`call_key`: every tensor's dtype, device and shape, its strides unless a dimension is
dynamic, every other argument's value) and a digest of the sources that make the stage's maths (this package
and the reference modules it calls) and of torch's and Triton's versions, so an edited stage never loads an
old file. Loading the saved stage or compiling it here gives the same code, so a restart's tokens are the
first start's.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3


class StageKeyError(TypeError):
    """An argument whose value cannot key a saved stage (the stage compiles in process instead)."""


def call_key(args: tuple, kwargs: dict, dynamic: dict[int, int]) -> tuple:
    """The signature a saved stage is compiled for; `dynamic` {argument position: dim} (kwargs by name)."""
    import torch

    def one(value: Any, dim: int | None) -> Any:
        if isinstance(value, torch.Tensor):
            shape = tuple(-1 if d == dim else s for d, s in enumerate(value.shape))
            layout = value.is_contiguous() if dim is not None else tuple(value.stride())
            return ("tensor", str(value.dtype), str(value.device), shape, layout)
        if value is None or isinstance(value, bool | int | float | str):
            return (type(value).__name__, value)
        if isinstance(value, torch.dtype):
            return ("dtype", str(value))
        if (
            hasattr(value, "__dict__")
            and value.__dict__
            and all(isinstance(v, torch.Tensor) for v in vars(value).values())
        ):  # an object of tensors (the FP4 grid): keyed by its tensors
            return (
                type(value).__qualname__,
                tuple((k, one(v, None)) for k, v in sorted(vars(value).items())),
            )
        raise StageKeyError(f"a {type(value).__name__} argument")

    named = tuple(sorted(kwargs.items()))
    return tuple(one(a, dynamic.get(i)) for i, a in enumerate(args)) + tuple(
        (k, one(v, dynamic.get(k))) for k, v in named
    )


@functools.cache
def source_digest() -> str:
    """Digest of the modules a stage's maths comes from (the fast forward and the reference modules it reuses),
    and of torch's and Triton's versions."""
    import torch

    try:
        import triton

        versions = f"{torch.__version__}\0{triton.__version__}"
    except ImportError:
        versions = torch.__version__
    here = Path(__file__).resolve().parent
    h = blake3.blake3(f"tfc.stages.v1\0{versions}\0".encode())
    for folder in (here, here.parent):
        for f in sorted(folder.glob("*.py")):
            h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def stage_path(folder: Path, fn: Callable[..., Any], key: tuple) -> Path:
    """Where the stage `fn` compiled for `key` is saved. Torch's thread count keys it too: a saved stage's guards
    check it (dynamo's global state), so a process with another count (OMP_NUM_THREADS, a TP rank's share of
    the cores) would refuse the file and compile in process at every start instead of saving its own."""
    import torch

    where = f"{fn.__module__}.{fn.__qualname__}\0threads={torch.get_num_threads()}"
    digest = blake3.blake3(f"{source_digest()}\0{where}\0{key!r}".encode())
    name = re.sub(r"[^A-Za-z0-9_.]", "_", fn.__qualname__)
    return folder / f"{name}-{digest.hexdigest()[:32]}.bin"


def load_or_compile(folder: Path, fn: Callable[..., Any], args: tuple, kwargs: dict, key: tuple,
                    mark: Callable[[], None]):  # fmt: skip
    """(The stage compiled for this call, "loaded" or "saved"): loaded from `folder` when saved there, else
    compiled (once `mark` has marked the call's dynamic dimensions) and saved."""
    import torch

    path = stage_path(folder, fn, key)
    if path.is_file():
        try:
            with open(path, "rb") as f:
                return torch.compiler.load_compiled_function(f, f_globals=fn.__globals__), "loaded"
        except Exception:  # a damaged file (a full disk, a killed writer elsewhere): compiled again over it
            pass
    mark()
    compiled = torch.compile(fn, dynamic=False, fullgraph=True).aot_compile((args, kwargs))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".stage-", suffix=".tmp")
    os.close(fd)
    try:
        compiled.save_compiled_function(tmp)
        os.replace(tmp, path)  # whole or absent: a reader never sees half a file
    except OSError:
        Path(tmp).unlink(missing_ok=True)  # a store that cannot take it: compiled in process all the same
    return compiled, "saved"
