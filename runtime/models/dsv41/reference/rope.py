"""DeepSeek-V4.1 rotary embeddings: interleaved pairs on the trailing rope channels, main and compressed bases.

Reference: huggingface/transformers deepseek_v41 configuration + modeling at 0a2080b4 (the `main` rope is
plain `rope_theta`; the `compress` rope is `compress_rope_theta` with the config's YaRN `rope_scaling` and
attention factor 1.0; layers with compress_ratio > 0 use `compress` for everything, ratio-0 layers `main`),
and src/transformers/modeling_rope_utils.py `_compute_yarn_parameters` (transformers 5.23.0) for YaRN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tfc.runtime.models.dsv41.config import Dsv41Config


def default_inv_freq(theta: float, dim: int) -> torch.Tensor:
    """One inverse frequency per rotated pair, fp32 as the reference computes them."""
    return 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))


def yarn_inv_freq(
    theta: float,
    dim: int,
    factor: float,
    original_max: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    """YaRN inverse frequencies: interpolated below the correction range, extrapolated above it."""

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original_max / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the reference's guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolate = 1 - ramp
    pos_freqs = theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolate) + (1.0 / pos_freqs) * extrapolate


@dataclass(frozen=True)
class Rope:
    """The two inverse-frequency tables of a model: `main` (ratio-0 layers) and `compress` (the others)."""

    main: torch.Tensor
    compress: torch.Tensor

    def cos_sin(
        self, positions: torch.Tensor, kind: str, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [..., rope_dim/2] at integer positions, for `kind` in {'main', 'compress'}."""
        inv = (self.main if kind == "main" else self.compress).to(positions.device)
        # fp32 angles as the reference; fp64 runs keep the fp32 frequencies but a wider product.
        work = torch.float64 if dtype == torch.float64 else torch.float32
        freqs = (positions.to(work).unsqueeze(-1) * inv.to(work)).double()
        # cos/sin in fp64 then rounded: a vectorised fp32 cos and its scalar tail can differ by an ulp,
        # which would make a position's rotation depend on where it fell in the batch.
        return freqs.cos().to(dtype), freqs.sin().to(dtype)


def build_rope(config: Dsv41Config) -> Rope:
    """Both rope tables of a config; YaRN only on `compress`, and only when rope_scaling asks for it."""
    dim = config.qk_rope_head_dim
    main = default_inv_freq(config.rope_theta, dim)
    scaling = dict(config.rope_scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "yarn":
        original = int(scaling["original_max_position_embeddings"])
        factor = scaling.get("factor") or config.max_position_embeddings / original
        compress = yarn_inv_freq(
            config.compress_rope_theta,
            dim,
            float(factor),
            original,
            float(scaling.get("beta_fast") or 32),
            float(scaling.get("beta_slow") or 1),
            # The port reads `truncate` from the outer main/compress dict, where it never is: always on.
            True,
        )
    elif kind == "default":
        compress = default_inv_freq(config.compress_rope_theta, dim)
    else:
        raise ValueError(f"rope_scaling type {kind!r} is not supported by the DeepSeek-V4.1 forward")
    return Rope(main=main, compress=compress)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate adjacent (even, odd) channel pairs of the trailing rope slice of x; leading channels pass.

    cos/sin broadcast against x[..., :1] after their last axis (e.g. [T, r/2] against [T, H, D] needs
    cos[:, None]); `inverse` applies the conjugate rotation (removes the query's rotation from outputs).
    """
    half = cos.shape[-1]
    rope = x[..., x.shape[-1] - 2 * half :]
    even, odd = rope[..., 0::2], rope[..., 1::2]
    if inverse:
        sin = -sin
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., : x.shape[-1] - 2 * half], rotated), dim=-1)
