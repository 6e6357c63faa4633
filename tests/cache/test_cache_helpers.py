"""Helpers for the cache tests: random rank images written through the public ImageWriter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tfc.cache.key import image_key
from tfc.cache.writer import ImageWriter

CHUNK = 4 << 20


def random_segments(seed: int, big: bool = True) -> dict[str, np.ndarray]:
    """A handful of random tensors of several dtypes, one longer than 3 digest chunks when `big`."""
    rng = np.random.default_rng(seed)
    segs = {
        "layers.0.attn.wq_b.trellis": rng.integers(-(2**15), 2**15, (4, 6, 48), dtype=np.int16),
        "layers.0.attn.wq_b.suh": rng.standard_normal(257).astype(np.float16),
        "layers.0.norm": rng.standard_normal(1000).astype(np.float32),
        "layers.0.ffn.experts.w1.offsets": rng.integers(0, 2**40, 9, dtype=np.int64),
    }
    if big:
        segs["layers.0.ffn.experts.w1.trellis"] = rng.integers(0, 256, 3 * CHUNK + 12345, dtype=np.uint8)
    return segs


_INPUTS: dict[str, dict] = {}  # world key -> the key inputs it is the digest of


def world_key_for(tag: str, world: int = 1) -> str:
    """A world key for tests: the digest of key inputs naming the tag (as readers check)."""
    inputs = {"format": 1, "world": world, "pack": {"identity": tag}}
    key = image_key(inputs)
    _INPUTS[key] = inputs
    return key


def fields(world_key: str, world: int = 1, rank: int = 0) -> dict:
    """Manifest fields as the compiler passes them."""
    return {
        "family": "deepseek_v41",
        "key": image_key({"world_key": world_key, "rank": rank}),
        "key_inputs": _INPUTS.get(world_key, {"format": 1, "world": world, "pack": {"identity": "x" * 8}}),
        "world": world,
        "plan": {"ranks": world, "layers": [1, 2, 3]},
        "meta": {"tool": "test"},
    }


def write_rank(
    root: Path, world_key: str, rank: int, segs: dict[str, np.ndarray], world: int = 1, files: int = 2
) -> Path:
    """Write and publish one rank folder; segments alternate between `files` data files."""
    with ImageWriter(root, world_key, rank) as w:
        slots = []
        for i, (name, a) in enumerate(segs.items()):
            slots.append(
                (w.add_segment(name, str(a.dtype), a.shape, "native.v1", a.nbytes, f"data{i % files}.bin"), a)
            )
        for slot, a in slots:
            w.write(slot, 0, a)
        return w.publish(fields(world_key, world, rank))


def write_world(root: Path, tag: str, world: int = 2, seed: int = 0, big: bool = True) -> Path:
    """Publish every rank of a world; returns the world folder."""
    wk = world_key_for(tag, world)
    for r in range(world):
        write_rank(root, wk, r, random_segments(seed + r, big), world)
    return root / wk[:16]
