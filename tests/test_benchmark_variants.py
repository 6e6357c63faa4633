"""benchmarks/step_variants_h200.py's variant names: each resolves to one set of switches."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def variants():
    sys.path.insert(0, str(BENCH))
    try:
        import step_variants_h200

        yield step_variants_h200
    finally:
        sys.path.remove(str(BENCH))


def test_no_named_variant_reads_as_a_numbered_one(variants):
    """A named variant such as "split3" once also read as split<N> (attend_rows.SPLIT_BLOCKS = 3), which
    set a value the kernel cannot compile; named and numbered names must not overlap."""
    clashes = [name for name in variants.NAMED if variants.numbered(name) is not None]
    assert not clashes, clashes


def test_numbered_variants_set_their_module_switch(variants):
    ((module, attribute, value),) = variants.switches("split2")
    assert (module.__name__, attribute, value) == ("tfc.kernels.dsv41.attend_rows", "SPLIT_BLOCKS", 2)
    assert variants.switches("torchtap")[0][1:] == ("TAP_KERNEL", False)
    assert variants.known_variant("mix512") and not variants.known_variant("split0")
