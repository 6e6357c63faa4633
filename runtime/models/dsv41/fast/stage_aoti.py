"""Compiled stages as AOTInductor packages: a stage call exported (torch.export) and compiled ahead into a `.pt2`
that torch's C++ loader runs, so a restart loads each stage in milliseconds and imports neither dynamo nor
inductor (torch.compile's stack, seconds of Python on every start otherwise).

A package serves one call signature (stage_cache.call_key: the non-tensor arguments are baked in). The
dimensions a stage names dynamic are exported as symbols, and export records the sizes each may take (a branch
on a size narrows them): the `.json` written beside the package keeps those ranges, a call is run only by a
package whose ranges hold its sizes, and a call outside every saved package's ranges compiles one more. The
loader checks nothing itself, so these checks are what keeps a package from running a shape it was not built
for.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import blake3
import torch
import torch.utils._pytree as pytree

# The inductor settings every package compiles under (fusion.py says why casts round as eager rounds them).
INDUCTOR = {"emulate_precision_casts": True}


class StageExportError(RuntimeError):
    """A stage call that torch.export or AOTInductor could not make into a package."""


def available() -> bool:
    """Whether this torch can compile and load AOTInductor packages."""
    aoti = getattr(torch._C, "_aoti", None)
    return aoti is not None and hasattr(aoti, "AOTIModelPackageLoader")


class _Leaves:
    """A call's tensors in order (every tensor argument, then each object of tensors' tensors by name) and how
    to put the call back together from them; `dims` {leaf: dynamic dim}."""

    def __init__(self, args: tuple, kwargs: dict, dynamic: dict[Any, int]) -> None:
        self.tensors: list[torch.Tensor] = []
        self.dims: dict[int, int] = {}
        self.template = ([self._take(a, dynamic.get(i)) for i, a in enumerate(args)],
                         {k: self._take(v, dynamic.get(k)) for k, v in sorted(kwargs.items())})  # fmt: skip

    def _take(self, value: Any, dim: int | None) -> Any:
        if isinstance(value, torch.Tensor):
            if dim is not None:
                self.dims[len(self.tensors)] = dim
            self.tensors.append(value)
            return ("leaf", len(self.tensors) - 1)
        if (
            hasattr(value, "__dict__")
            and value.__dict__
            and all(isinstance(v, torch.Tensor) for v in vars(value).values())
        ):  # an object of tensors (the FP4 grid)
            return ("object", value, {k: self._take(v, None) for k, v in sorted(vars(value).items())})
        return ("constant", value)

    def rebuild(self, leaves: tuple) -> tuple[list, dict]:
        """The call's (args, kwargs) with `leaves` in the tensors' places."""

        def put(item: tuple) -> Any:
            if item[0] == "leaf":
                return leaves[item[1]]
            if item[0] == "object":
                obj = copy.copy(item[1])
                obj.__dict__.update({k: put(v) for k, v in item[2].items()})
                return obj
            return item[1]

        args, kwargs = self.template
        return [put(a) for a in args], {k: put(v) for k, v in kwargs.items()}


class _Call(torch.nn.Module):
    """fn at one call signature, as a module of the call's tensors (what torch.export takes)."""

    def __init__(self, fn: Callable[..., Any], leaves: _Leaves) -> None:
        super().__init__()
        self.fn, self.leaves = fn, leaves

    def forward(self, *tensors: torch.Tensor) -> Any:
        args, kwargs = self.leaves.rebuild(tensors)
        return self.fn(*args, **kwargs)


class _Package:
    """One loaded package and the sizes it takes: [(leaf, dim, symbol, low, high or None)]."""

    def __init__(self, path: Path, ranges: list, device: torch.device) -> None:
        index = device.index if device.type == "cuda" else -1
        if device.type == "cuda" and index is None:
            index = torch.cuda.current_device()
        self.loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, index)
        self.out_spec = pytree.treespec_loads(self.loader.get_call_spec()[1])
        self.ranges = ranges

    def takes(self, tensors: list[torch.Tensor]) -> bool:
        """Whether every dynamic size of this call lies in the package's range (and sizes of one symbol agree)."""
        seen: dict[str, int] = {}
        for leaf, dim, symbol, low, high in self.ranges:
            size = tensors[leaf].shape[dim]
            if size < low or (high is not None and size > high) or seen.setdefault(symbol, size) != size:
                return False
        return True

    def __call__(self, tensors: list[torch.Tensor]) -> Any:
        return pytree.tree_unflatten(self.loader.run(tensors), self.out_spec)


class AotiStage:
    """A stage at one call signature: its saved packages (`<base>-<ranges digest>.pt2` + `.json`), loaded the
    first time a call needs them, and compiled for a call none of them takes."""

    def __init__(self, base: Path, fn: Callable[..., Any], dynamic: dict[Any, int],
                 counted: Callable[[str], None]) -> None:  # fmt: skip
        self.base, self.fn, self.dynamic, self.counted = base, fn, dynamic, counted
        self.packages: list[_Package] = []
        self.seen: set[Path] = set()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves = _Leaves(args, kwargs, self.dynamic)
        tensors = leaves.tensors
        package = self._find(tensors)
        if package is None:
            package = self._compile(leaves)
        return package(tensors)

    def _find(self, tensors: list[torch.Tensor]) -> _Package | None:
        for package in self.packages:
            if package.takes(tensors):
                return package
        for sidecar in sorted(self.base.parent.glob(f"{self.base.name}-*.json")):
            path = sidecar.with_suffix(".pt2")
            if path in self.seen or not path.is_file():
                continue
            self.seen.add(path)
            try:
                package = _Package(path, json.loads(sidecar.read_text())["ranges"], tensors[0].device)
            except Exception:  # a damaged package (a full disk, a killed writer): compiled again
                continue
            self.packages.append(package)
            if package.takes(tensors):
                self.counted("loaded")
                return package
        return None

    def _compile(self, leaves: _Leaves) -> _Package:
        """Export fn at this call, compile it to a package beside the others, load it."""
        import torch._inductor  # the compiler, imported only where a package is missing
        from tfc.runtime.models.dsv41.fast.fusion import compiler_settings

        compiler_settings()
        shapes = tuple({leaves.dims[j]: torch.export.Dim.AUTO} if j in leaves.dims else None
                       for j in range(len(leaves.tensors)))  # fmt: skip
        try:
            program = torch.export.export(_Call(self.fn, leaves), tuple(leaves.tensors),
                                          dynamic_shapes=(shapes,), strict=False)  # fmt: skip
            ranges = _ranges(program, leaves.dims)
        except Exception as error:
            raise StageExportError(
                f"export: {type(error).__name__}: {str(error).splitlines()[0][:200]}"
            ) from error
        digest = blake3.blake3(json.dumps(ranges).encode()).hexdigest()[:16]
        path = self.base.parent / f"{self.base.name}-{digest}.pt2"
        fd, tmp = tempfile.mkstemp(dir=self.base.parent, prefix=".stage-", suffix=".pt2")
        os.close(fd)
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=tmp, inductor_configs=INDUCTOR)
            os.replace(tmp, path)  # whole or absent; the sidecar, written last, marks it complete
            _write_atomic(path.with_suffix(".json"), json.dumps({"ranges": ranges}))
        finally:
            Path(tmp).unlink(missing_ok=True)
        self.seen.add(path)
        package = _Package(path, ranges, leaves.tensors[0].device)
        self.packages.append(package)
        self.counted("saved")
        return package


def _ranges(program: Any, dims: dict[int, int]) -> list:
    """[(leaf, dim, symbol, low, high or None)] of the exported program's dynamic sizes (a size export fixed
    to one value is a range of one)."""
    inputs = [n for n in program.graph.nodes if n.op == "placeholder"]
    out = []
    for leaf, dim in sorted(dims.items()):
        size = inputs[leaf].meta["val"].shape[dim]
        if isinstance(size, int):
            out.append([leaf, dim, f"fixed{leaf}.{dim}", size, size])
            continue
        symbol = size.node.expr
        if symbol not in program.range_constraints:
            raise StageExportError(
                f"the dynamic size of input {leaf} is an expression ({symbol}), not a symbol"
            )
        valid = program.range_constraints[symbol]
        out.append([leaf, dim, str(symbol), int(valid.lower), _bound(valid.upper)])
    return out


def _bound(upper: Any) -> int | None:
    """An upper size bound as an int, None where unbounded (sympy's infinities take no int())."""
    try:
        return int(upper)
    except (AttributeError, TypeError, OverflowError, ValueError):
        return None


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".stage-", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)
