"""Random EXL3 inputs for the kernel tests, seeded per case so that a case sees the same inputs alone or in a run."""

from __future__ import annotations

import zlib

import numpy as np
import torch


def seeded(name: str) -> np.random.Generator:
    """Seeds torch's generator and returns a numpy one, both from the case's name."""
    seed = zlib.crc32(name.encode())
    torch.manual_seed(seed)
    return np.random.default_rng(seed)


def random_group(ref, rng: np.random.Generator, k: int, n: int, width: int, cb: int):
    """A random EXL3 group as torch tensors (trellis never all zero, small suh, larger svh) and its dense weight
    from `ref` (an exl3_reference module)."""
    trellis = rng.integers(-32768, 32768, size=(k // 16, n // 16, width), dtype=np.int16)
    suh = (rng.standard_normal(k) * 0.05).astype(np.float16)
    svh = (rng.standard_normal(n) * 0.5).astype(np.float16)
    dense = torch.from_numpy(ref.dequant(trellis, suh, svh, cb))
    return (torch.from_numpy(trellis), torch.from_numpy(suh), torch.from_numpy(svh), cb), dense


def cuda_group(k: int, n: int, bits: float, codebook: int, seed: int):
    """A random EXL3 group on the GPU (trellis, suh, svh, codebook) at `bits` per weight, seeded."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    width = int(16 * bits)
    trellis = torch.randint(
        -32768, 32768, (k // 16, n // 16, width), dtype=torch.int16, device="cuda", generator=gen
    )
    suh = (torch.randn(k, device="cuda", generator=gen) * 0.02).half()
    svh = (torch.randn(n, device="cuda", generator=gen) * 0.5 + 1.0).half()
    return trellis, suh, svh, codebook


def row_share(g, lo: int, hi: int):
    """Rows [lo, hi) of a group (trellis, suh, svh, codebook): a row-parallel rank's share."""
    t, suh, svh, cb = g
    return t[lo // 16 : hi // 16].contiguous(), suh[lo:hi].contiguous(), svh, cb


def col_share(g, lo: int, hi: int):
    """Columns [lo, hi) of a group: a column-parallel rank's share."""
    t, suh, svh, cb = g
    return t[:, lo // 16 : hi // 16].contiguous(), suh, svh[lo:hi].contiguous(), cb


def pooled_groups(made) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Groups (trellis, suh, svh, codebook) of one shape copied back to back into one int16 buffer, as a
    grouped launch reads them: each group's (trellis, suh, svh) views into it."""
    pool = torch.cat(
        [torch.cat([t.flatten(), s.view(torch.int16), v.view(torch.int16)]) for t, s, v, _ in made]
    )
    words, k, n = made[0][0].numel(), made[0][1].numel(), made[0][2].numel()
    size = words + k + n
    return [(pool[g * size : g * size + words].view(made[0][0].shape),
             pool[g * size + words : g * size + words + k].view(torch.float16),
             pool[g * size + words + k : (g + 1) * size].view(torch.float16)) for g in range(len(made))]  # fmt: skip
