"""warm_imports: torch.compile's stack imported in a thread during a CUDA boot's upload where stages are torch's saved
functions, and nowhere else (not where they are AOTInductor packages, which load without it)."""

from __future__ import annotations

import sys

import pytest
from tfc.runtime.boot import warm_imports
from tfc.runtime.models.dsv41.fast import stage_aoti


def test_a_cpu_boot_or_compiling_off_starts_nothing(monkeypatch):
    assert warm_imports.start("cpu") is None
    monkeypatch.setenv("TFC_COMPILE", "0")
    assert warm_imports.start("cuda:0") is None
    warm_imports.finish(None)


def test_a_cuda_boot_with_packaged_stages_imports_nothing(monkeypatch):
    monkeypatch.delenv("TFC_COMPILE", raising=False)
    monkeypatch.delenv("TFC_STAGE_AOTI", raising=False)
    if not stage_aoti.available():
        pytest.skip("this torch has no AOTInductor loader")
    assert warm_imports.start("cuda:0", ("colorsys",)) is None


def test_a_cuda_boot_imports_in_a_thread_and_a_failing_import_is_left_to_its_user(monkeypatch):
    monkeypatch.delenv("TFC_COMPILE", raising=False)
    monkeypatch.setenv("TFC_STAGE_AOTI", "0")  # torch's saved functions: their load needs the stack
    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    thread = warm_imports.start("cuda:0", ("colorsys", "tfc_no_such_module", "json"))
    assert thread is not None and thread.daemon
    warm_imports.finish(thread)
    assert not thread.is_alive() and "colorsys" in sys.modules
