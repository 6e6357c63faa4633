"""The quantise-dequantise steps DeepSeek-V4.1 applies to cached keys (FP8 window KV, FP4 compressed KV and index keys).

Reference: huggingface/transformers src/transformers/models/deepseek_v41/modeling_deepseek_v41.py at
0a2080b43eb64e6d448186a4f3f0bc9c618f4797 (`_fake_quant_fp8_block`, `_fake_quant_fp4_block`,
`_pow2_ceil_scale`, `_e2m1_codes`). The values are part of the model (QAT): a forward that skips them
computes something else. Maths run in fp32 as in the reference; the result takes the input's dtype.
"""

from __future__ import annotations

import torch

FP8_MAX = 448.0  # float8_e4m3fn largest finite value
FP4_MAX = 6.0  # e2m1 largest value
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def pow2_ceil(t: torch.Tensor) -> torch.Tensor:
    """2**ceil(log2(t)) for positive normal fp32 t (the UE8M0 scale rounding)."""
    mantissa, exponent = torch.frexp(t)
    # frexp gives t = m * 2**e with m in [0.5, 1); an exact power of two has m == 0.5.
    return torch.ldexp(torch.ones_like(t), torch.where(mantissa == 0.5, exponent - 1, exponent))


def round_e2m1(q: torch.Tensor) -> torch.Tensor:
    """Round fp32 values already inside [-6, 6] to the nearest e2m1 value, ties to the even code."""
    grid = torch.tensor(_E2M1, dtype=q.dtype, device=q.device)
    dist = (q.abs().unsqueeze(-1) - grid).abs()
    nearest = dist == dist.amin(-1, keepdim=True)
    odd = torch.arange(len(_E2M1), device=q.device) % 2
    # Among equally near grid points prefer the even code (round-to-nearest-even on the code).
    key = (~nearest).to(torch.int64) * 2 + odd
    mag = grid[key.argmin(-1)]
    return torch.where(torch.signbit(q), -mag, mag)


def e4m3_block_scale(amax: torch.Tensor) -> torch.Tensor:
    """The e4m3 scale (float8_e4m3fn) of FP4 blocks with largest magnitudes amax: amax / 6, floored at 2**-9 and
    saturated at 448 (torch >= 2.13 saturates a finite overflow; older torch casts it to NaN)."""
    return (amax.clamp_min(FP4_MAX * 2.0**-9) / FP4_MAX).clamp_max(FP8_MAX).to(torch.float8_e4m3fn)


def fake_quant_fp8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """FP8 e4m3 with one power-of-two scale per `block` channels (the window KV cache)."""
    n = x.shape[-1]
    if n % block:
        return x  # the reference leaves shapes it cannot block unquantised
    b = x.float().reshape(*x.shape[:-1], n // block, block)
    scale = pow2_ceil(b.abs().amax(-1).clamp_min(1e-4) * (1.0 / FP8_MAX)).unsqueeze(-1)
    q = (b / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return (q * scale).reshape(x.shape).to(x.dtype)


def fake_quant_fp4(x: torch.Tensor, block: int, e4m3_scale: bool = False) -> torch.Tensor:
    """FP4 e2m1 per `block` channels: UE8M0 scales (index keys/queries) or e4m3 scales (compressed KV)."""
    n = x.shape[-1]
    if n % block:
        return x
    b = x.float().reshape(*x.shape[:-1], n // block, block)
    amax = b.abs().amax(-1)
    if e4m3_scale:
        scale = e4m3_block_scale(amax).float()
    else:
        scale = pow2_ceil(amax.clamp_min(FP4_MAX * 2.0**-126) * (1.0 / FP4_MAX))
    scale = scale.unsqueeze(-1)
    q = round_e2m1((b / scale).clamp(-FP4_MAX, FP4_MAX))
    return (q * scale).reshape(x.shape).to(x.dtype)
