"""warm_imports: torch.compile's stack imported in a thread during a CUDA boot's upload, and nowhere else."""

from __future__ import annotations

import sys

from tfc.runtime.boot import warm_imports


def test_a_cpu_boot_or_compiling_off_starts_nothing(monkeypatch):
    assert warm_imports.start("cpu") is None
    monkeypatch.setenv("TFC_COMPILE", "0")
    assert warm_imports.start("cuda:0") is None
    monkeypatch.delenv("TFC_COMPILE")
    monkeypatch.delenv("TFC_STAGE_KERNELS", raising=False)  # the stage kernels, the default: none compiles
    assert warm_imports.start("cuda:0") is None
    warm_imports.finish(None)


def test_a_cuda_boot_imports_in_a_thread_and_a_failing_import_is_left_to_its_user(monkeypatch):
    monkeypatch.delenv("TFC_COMPILE", raising=False)
    monkeypatch.setenv("TFC_STAGE_KERNELS", "0")  # the compiled stages
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    thread = warm_imports.start("cuda:0", ("colorsys", "tfc_no_such_module", "json"))
    assert thread is not None and thread.daemon
    warm_imports.finish(thread)
    assert not thread.is_alive() and "colorsys" in sys.modules
