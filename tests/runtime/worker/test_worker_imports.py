"""The commands that boot import no torch before the boot starts, so the early CUDA start overlaps torch's import."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "module", ["tfc.runtime.worker.worker", "tfc.runtime.worker.step", "tfc.cli.load_cmd", "tfc.cli.generate_cmd", "tfc.cli.serve_cmd",
               "tfc.runtime.boot.rank"],
)  # fmt: skip
def test_importing_a_booting_command_imports_no_torch(module):
    code = f"import sys, {module}; sys.exit(3 if 'torch' in sys.modules else 0)"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0, f"{module} imports torch"
