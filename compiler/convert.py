"""Element conversions from stored dtypes to held dtypes (bf16 rounding to nearest even)."""

from __future__ import annotations

import numpy as np
from tfc.compiler.errors import BuildError
from tfc.compiler.segments import STORED_NUMPY


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16) to float32, exactly."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 to bf16 bit patterns, rounding to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x40).astype(np.uint16)
    return rounded


def bf16_round(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bf16, as float32."""
    return bf16_bits_to_f32(f32_to_bf16_bits(values))


def to_f32(raw: np.ndarray, stored: str) -> np.ndarray:
    """Stored float elements (raw bytes) as float32 values."""
    values = raw.view(STORED_NUMPY[stored])
    if stored == "BF16":
        return bf16_bits_to_f32(values)
    if stored in ("F32", "F16", "F64"):
        return values.astype(np.float32)
    raise BuildError(f"cannot convert stored dtype {stored} to a float")


def convert_elements(raw: np.ndarray, stored: str, held: str) -> np.ndarray:
    """Raw stored bytes converted to the held dtype, as raw bytes."""
    if held == "float32":
        return to_f32(raw, stored).view(np.uint8)
    if held == "float32_bf16":
        return bf16_round(to_f32(raw, stored)).view(np.uint8)
    if held == "bfloat16":
        return f32_to_bf16_bits(to_f32(raw, stored)).view(np.uint8)
    if held == "float16":
        return to_f32(raw, stored).astype(np.float16).view(np.uint8)
    raise BuildError(f"no conversion from {stored} to {held}")
