"""EXL3 codebooks: the three 16-bit state -> fp16 maps (spec exl3.md §4) as constants and numpy LUTs."""

from __future__ import annotations

from functools import cache

import numpy as np

CODEBOOKS = ("3inst", "mcg", "mul1")  # index = codebook id used in expert tables
CB_3INST, CB_MCG, CB_MUL1 = 0, 1, 2

# 3INST / MCG: x = s * MULT + ADD (mod 2^32), then LOP3 and the sum of the two fp16 halves.
INST_MULT, INST_ADD = 89226354, 64248484
MCG_MULT = 0xCBAC1FED
LOP3_AND, LOP3_XOR = 0x8FFF8FFF, 0x3B603B60
# MUL1: x = s * MULT; b = sum of the 4 bytes of x; value = (1024 + b) * K_INV + K_BIAS, one fp16 rounding.
MUL1_MULT = 0x83DCD12D
MUL1_K_INV = float(np.uint16(0x1EEE).view(np.float16))  # 1774 * 2^-18
MUL1_K_BIAS = float(np.uint16(0xC931).view(np.float16))  # -10.3828125
# RMS of 3INST over all states; 1/this is folded into suh for every codebook.
CODEBOOK_SCALE = 1.24371088


def codebook_id(name: str) -> int:
    """The numeric id (0 3inst, 1 mcg, 2 mul1) of a codebook name."""
    return CODEBOOKS.index(name)


def decode_states(states: np.ndarray, codebook: int | str) -> np.ndarray:
    """Map 16-bit states (any integer array) to their fp16 codebook values, bit-exact."""
    cb = codebook_id(codebook) if isinstance(codebook, str) else int(codebook)
    s = np.asarray(states).astype(np.uint32) & np.uint32(0xFFFF)
    if cb == CB_MUL1:
        x = s * np.uint32(MUL1_MULT)
        b = (x & 0xFF) + ((x >> 8) & 0xFF) + ((x >> 16) & 0xFF) + (x >> 24)
        # (1024 + b) * k_inv + k_bias is exact in fp32; one rounding to fp16 matches __hfma.
        v = (1024.0 + b.astype(np.float32)) * np.float32(MUL1_K_INV) + np.float32(MUL1_K_BIAS)
        return v.astype(np.float16)
    if cb not in (CB_3INST, CB_MCG):
        raise ValueError(f"unknown codebook id {cb}")
    mult, add = (INST_MULT, INST_ADD) if cb == CB_3INST else (MCG_MULT, 0)
    x = s * np.uint32(mult) + np.uint32(add)
    x = (x & np.uint32(LOP3_AND)) ^ np.uint32(LOP3_XOR)
    lo = (x & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)
    hi = (x >> 16).astype(np.uint16).view(np.float16).astype(np.float32)
    # Both halves lie in ±[0.125, 2): their fp32 sum is exact, so one rounding equals __hadd.
    return (lo + hi).astype(np.float16)


@cache
def lut(codebook: int | str) -> np.ndarray:
    """The 65,536-entry fp16 table of a codebook (read-only)."""
    table = decode_states(np.arange(65536, dtype=np.uint32), codebook)
    table.setflags(write=False)
    return table
