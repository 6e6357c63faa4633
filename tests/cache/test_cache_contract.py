"""The image contract modules that compiler and runtime share import nothing outside the standard library."""

from __future__ import annotations

import subprocess
import sys

from tfc.cache import contract
from tfc.packs import deepseek_v41_contract as dsv41


def test_contract_modules_are_stdlib_only():
    code = (
        "import sys\n"
        "for name in ('numpy', 'torch', 'blake3'):\n"
        "    sys.modules[name] = None\n"
        "import tfc.cache.contract, tfc.packs.deepseek_v41_contract\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_layout_ids_and_family_name_are_well_formed():
    assert all(contract.ID.fullmatch(layout) for layout in contract.LAYOUTS)
    assert contract.ID.fullmatch(dsv41.FAMILY)
    assert contract.SegmentSpec("float16", (3, 5), contract.LAYOUT_SCALES).nbytes == 30
