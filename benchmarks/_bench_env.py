"""Make `tfc` importable from a checkout (the GPU host runs benchmarks without installing the package)."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"tfc": "tfc", "tfc.packs": "packs", "tfc.compiler": "compiler", "tfc.cache": "cache",
           "tfc.runtime": "runtime", "tfc.kernels": "kernels", "tfc.fixtures": "fixtures"}  # fmt: skip


def ensure_tfc() -> None:
    """Import tfc as installed, or map the checkout's folders onto tfc.* package names."""
    if importlib.util.find_spec("tfc") is not None and importlib.util.find_spec("tfc.packs") is not None:
        return
    for name, folder in FOLDERS.items():
        module = types.ModuleType(name)
        module.__path__ = [str(ROOT / folder)]
        module.__file__ = str(ROOT / folder / "__init__.py")
        sys.modules[name] = module
        if "." in name:
            setattr(sys.modules["tfc"], name.split(".", 1)[1], module)
