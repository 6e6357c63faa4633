"""A segment's tier travels writer -> manifest -> reader (device when absent), and runs of zeros stay holes."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from test_cache_helpers import CHUNK, fields, world_key_for
from tfc.cache.digest import segment_digest
from tfc.cache.errors import ImageError
from tfc.cache.format import RankManifest
from tfc.cache.verify import verify_image
from tfc.cache.writer import ImageWriter


def test_tiers_round_trip_and_device_is_left_unwritten(tmp_path):
    wk = world_key_for("tiers")
    rng = np.random.default_rng(0)
    data = {name: rng.integers(0, 256, 5000, dtype=np.uint8) for name in ("a", "b", "c")}
    with ImageWriter(tmp_path, wk, 0) as w:
        slots = [w.add_segment(n, "uint8", (5000,), "native.v1", 5000, "L00.bin", tier=t)
                 for n, t in zip(data, ("device", "host", "nvme"), strict=True)]  # fmt: skip
        for slot in slots:
            w.write(slot, 0, data[slot.name])
        path = w.publish(fields(wk))
    m = RankManifest.load(path)
    assert [s.tier for s in m.segments] == ["device", "host", "nvme"]
    stored = json.loads((path / "manifest.json").read_text())["segments"]
    assert "tier" not in stored[0] and stored[1]["tier"] == "host"  # a device-only manifest reads as before
    assert RankManifest.from_bytes(m.to_json().encode()) == m
    with (
        ImageWriter(tmp_path, world_key_for("bad tier"), 0) as w,
        pytest.raises(ImageError, match="tier 'gpu'"),
    ):
        w.add_segment("a", "uint8", (1,), "native.v1", 1, tier="gpu")


def test_zero_runs_stay_holes_and_digest_as_zeros(tmp_path):
    wk = world_key_for("zeros")
    length = 3 * CHUNK + 12345
    head = np.random.default_rng(1).integers(1, 256, 1000, dtype=np.uint8)
    with ImageWriter(tmp_path, wk, 0) as w:
        slot = w.add_segment("rows", "uint8", (length,), "native.v1", length, "L01.bin",
                             holes=length - 1000)  # fmt: skip
        w.write(slot, 0, head)
        w.write_zeros(slot, 1000, CHUNK + 7)  # ends inside a chunk
        w.write_zeros(slot, CHUNK + 1007, length - CHUNK - 1007)  # whole chunks, then a short last one
        with pytest.raises(ImageError, match="exceed"):
            w.write_zeros(slot, length - 10, 11)
        path = w.publish(fields(wk))
    whole = np.zeros(length, np.uint8)
    whole[:1000] = head
    entry = RankManifest.load(path).segment_map["rows"]
    assert (entry.digest, entry.chunks) == (segment_digest(whole).digest, segment_digest(whole).chunks)
    st = os.stat(path / "L01.bin")
    assert st.st_size >= length and st.st_blocks * 512 < CHUNK  # the zeros take no disk
    assert verify_image(path, mode="full").ok
