"""The compiler stack a CUDA boot imports later (torch.compile's dynamo and inductor, a few seconds of Python),
imported in a thread while the image uploads: the upload's copies run in C threads, so the two overlap."""

from __future__ import annotations

import importlib
import threading

COMPILER = ("torch._dynamo", "torch._inductor.compile_fx")


def start(device: str, modules: tuple[str, ...] = COMPILER) -> threading.Thread | None:
    """A started thread importing `modules` for a CUDA boot with compiled stages on; None otherwise."""
    from tfc.runtime.models.dsv41.fast.fusion import wanted

    if not device.startswith("cuda") or not wanted("cuda"):
        return None
    thread = threading.Thread(target=_import, args=(modules,), name="tfc-warm-imports", daemon=True)
    thread.start()
    return thread


def finish(thread: threading.Thread | None) -> None:
    """Wait for start's imports (before the boot imports anything itself, so no two imports cross)."""
    if thread is not None:
        thread.join()


def _import(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # the code that needs the module imports it again and says what is wrong
            return
