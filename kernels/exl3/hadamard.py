"""The 128-value block Hadamard of EXL3 (natural/Sylvester order, 1/sqrt(128)) for numpy and torch."""

from __future__ import annotations

from functools import cache

import numpy as np

BLOCK = 128
SCALE = 1.0 / np.sqrt(128.0)


@cache
def _signs(dtype: str) -> np.ndarray:
    i = np.arange(BLOCK)
    bits = np.bitwise_and(i[:, None], i[None, :])
    parity = np.zeros_like(bits)
    for b in range(7):
        parity ^= (bits >> b) & 1
    h = (1 - 2 * parity).astype(dtype)
    h.setflags(write=False)
    return h


def hadamard128(dtype: str = "float32", normalized: bool = True) -> np.ndarray:
    """H[i, j] = (-1)^popcount(i & j), times 1/sqrt(128) when normalized (symmetric, orthonormal)."""
    h = _signs("float64")
    return (h * SCALE).astype(dtype) if normalized else h.astype(dtype)


def had128_torch(x, dim: int = -1):
    """Torch: the normalized block Hadamard along `dim` (length a multiple of 128), in x's dtype."""
    import torch

    h = torch.from_numpy(hadamard128("float64")).to(device=x.device, dtype=x.dtype)
    xt = x.movedim(dim, -1)
    shape = xt.shape
    y = (xt.reshape(*shape[:-1], shape[-1] // BLOCK, BLOCK) @ h).reshape(shape)
    return y.movedim(-1, dim)
