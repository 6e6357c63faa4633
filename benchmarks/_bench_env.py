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


def compiled_stats(kernel) -> list[dict]:
    """Registers, spills, warps, stages and shared memory of every compiled specialisation of a Triton kernel (its
    kernel cache), or the error of a Triton without these fields (the caller times anyway)."""
    out = []
    try:
        for caches in kernel.device_caches.values():
            for kern in caches[0].values():
                kern._init_handles()
                out.append({"regs": kern.n_regs, "spills": kern.n_spills, "warps": kern.metadata.num_warps,
                            "stages": kern.metadata.num_stages, "shared": kern.metadata.shared})  # fmt: skip
    except Exception as exc:
        out.append({"error": f"{type(exc).__name__}: {exc}"})
    return out


class Parts:
    """A benchmark's named parts: each timed, a failure kept as its traceback's tail (the whole traceback in a file
    beside the JSON), the JSON rewritten after each, parts that would start past `budget_s` skipped."""

    def __init__(self, res: dict, out: Path, budget_s: float = float("inf")) -> None:
        import time

        self.res, self.out, self.budget_s, self.t0 = res, out, budget_s, time.time()
        res.setdefault("parts", {})
        out.parent.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        """Rewrite the JSON with the wall time so far."""
        import json
        import time

        self.res["wall_s"] = round(time.time() - self.t0, 1)
        self.out.write_text(json.dumps(self.res, indent=1))

    def __call__(self, name: str, fn) -> None:
        import time
        import traceback

        parts = self.res["parts"]
        if time.time() - self.t0 > self.budget_s:
            parts[name] = "skipped: past --budget-s"
        else:
            started = time.time()
            try:
                fn()
                parts[name] = f"{time.time() - started:.1f} s"
            except Exception:
                whole = traceback.format_exc()  # chained errors print the inner one first: keep it all beside
                self.out.with_name(f"{self.out.stem}_{name}_traceback.txt").write_text(whole)
                parts[name] = "failed: " + whole[-1500:]
        self.save()
        print(f"[{time.time() - self.t0:6.1f} s] {name}: {parts[name][:300]}", flush=True)
