"""Triton's CPU interpreter inside a pytest process that also runs native Triton: a private, interpreted copy.

Triton decides interpreter or native when a function is decorated: `@triton.jit` reads TRITON_INTERPRET then,
triton.language decorates its own helpers (tl.zeros, tl.sum, ...) when triton is imported, and
tfc.kernels.exl3.tl reads the variable once at import. In one pytest process over tests/ other modules import
triton and the kernels natively long before an interpreter test is reached, so setting the variable in a
conftest would be ignored, and setting it for the whole process would take native Triton from the GPU tests.

`Interpreted` imports its own copy of triton's Python modules and of the given packages with TRITON_INTERPRET=1
(the compiled triton._C extension is shared; the interpreter calls into it as usual) and keeps the copy apart
from the process's modules. Inside `active()` the copy is swapped into sys.modules and the variable is set, so
that imports made meanwhile, by a test or by Triton itself, find the interpreted modules; on leaving, the
process's own modules are back. tests/kernels/interpret/ uses it (its conftest) and checks both sides.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types
from collections.abc import Iterator, Mapping, Sequence

FLAG = "TRITON_INTERPRET"
PARKED = "interpreted:"  # prefix of the names the copy is parked under (see park)


class Interpreted:
    """triton and `packages` as imported with TRITON_INTERPRET=1 (first `modules`), swapped in on demand."""

    def __init__(self, modules: Sequence[str], packages: Sequence[str] = ("tfc.kernels",)) -> None:
        # whether this process itself runs Triton interpreted (TRITON_INTERPRET set when it started)
        self.process_interprets = os.environ.get(FLAG, "0") not in ("", "0")
        self.packages = tuple(packages)
        self.modules: dict[str, types.ModuleType] = {}
        with self.active():
            for name in modules:
                importlib.import_module(name)

    def swapped(self, name: str) -> bool:
        """Whether module `name` differs between the copy and the process: triton's Python side, the packages."""
        if name == "triton" or name.startswith("triton."):
            return not name.startswith("triton._C")
        return any(name == p or name.startswith(p + ".") for p in self.packages)

    def namespace(self, package: str, names: Mapping[str, str]) -> types.SimpleNamespace:
        """The copy's modules package.MODULE under their short names (`names`: short name -> MODULE)."""
        return types.SimpleNamespace(**{n: self.modules[f"{package}.{m}"] for n, m in names.items()})

    @contextlib.contextmanager
    def active(self) -> Iterator[Interpreted]:
        saved = {name: mod for name, mod in sys.modules.items() if self.swapped(name)}
        # a package is also an attribute of its parent (tfc.kernels of tfc): swapped along with sys.modules
        parents = [p.rpartition(".") for p in self.packages if "." in p]
        attrs = [(sys.modules.get(parent), child) for parent, _, child in parents]
        saved_attrs = [(mod, child, mod.__dict__.get(child)) for mod, child in attrs if mod is not None]
        env = os.environ.get(FLAG)
        for name in saved:
            del sys.modules[name]
        sys.modules.update(self.modules)
        for mod, child, _ in saved_attrs:
            mine = self.modules.get(f"{mod.__name__}.{child}")
            if mine is not None:
                setattr(mod, child, mine)
        os.environ[FLAG] = "1"
        try:
            yield self
        finally:
            # whatever was imported meanwhile belongs to the copy; the process gets its own modules back
            self.modules = {name: mod for name, mod in sys.modules.items() if self.swapped(name)}
            for name in self.modules:
                del sys.modules[name]
            sys.modules.update(saved)
            for mod, child, value in saved_attrs:
                if value is None:
                    mod.__dict__.pop(child, None)
                else:
                    setattr(mod, child, value)
            if env is None:
                os.environ.pop(FLAG, None)
            else:
                os.environ[FLAG] = env

    def park(self) -> None:
        """Leaves the copy in sys.modules under names no import asks for, so that Python's exit clears it with
        the other modules before triton's extension goes (objects still alive then make nanobind report leaks)."""
        for name, mod in self.modules.items():
            sys.modules[f"{PARKED}{name}"] = mod
