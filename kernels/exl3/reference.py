"""Reference EXL3 decode in numpy (spec exl3.md §3-§7): trellis + suh + svh + codebook -> dense W [k, n]."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import numpy as np
from tfc.kernels.exl3.codebook import CB_MUL1, CODEBOOKS, lut
from tfc.kernels.exl3.hadamard import BLOCK, hadamard128

from tfc.errors import TfcError


class Exl3FormatError(TfcError, ValueError):
    """A trellis width, codebook or shape the EXL3 format does not allow."""


def check_width(width: int, codebook: int) -> None:
    """Refuse widths exllamav3 cannot write: 16..128 words, x.5 rates only with MUL1."""
    if width % 8 or not 16 <= width <= 128:
        raise Exl3FormatError(f"trellis width {width} is not 16*bits for bits in 1..8 (or 1.5/2.5/3.5)")
    if width % 16 and (codebook != CB_MUL1 or width > 56):
        raise Exl3FormatError(
            f"half-rate width {width} ({width / 16} bits) needs the mul1 codebook and at most 3.5 bits,"
            f" not {CODEBOOKS[codebook]}"
        )


def bits_of_width(width: int) -> float:
    """Bits per weight of a trellis width W (W = 16 * bits)."""
    return width / 16


@cache
def window_ends(width: int) -> np.ndarray:
    """Exclusive ring-bit end e_i of each stream position's 16-bit window: cumsum of the bit budgets."""
    i = np.arange(256)
    # d_i = KA + (i odd) for half rates, K for integer rates; both sum to floor((i+1) * W / 16).
    return ((i + 1) * width) >> 4


@cache
def window_words(width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per position: (j, jp, shift) so that state = ((w[jp] << 32 | w[j]) >> shift) & 0xFFFF."""
    e = window_ends(width)
    nw = width // 2
    j = (e - 1) // 32
    jp = (j - 1) % nw
    shift = 31 - ((e - 1) % 32)
    return j, jp, shift


@cache
def position_rc() -> tuple[np.ndarray, np.ndarray]:
    """Tile (row, column) of each stream position i (tensor-core order, spec §5)."""
    i = np.arange(256)
    t, p = i // 8, i % 8
    r = 2 * (t % 4) + (p & 1) + 8 * ((p >> 1) & 1)
    c = (t // 4) + 8 * (p >> 2)
    return r, c


def words32(trellis: np.ndarray) -> np.ndarray:
    """The tile's little-endian uint32 words: w[j] = u16[2j] | u16[2j+1] << 16, as uint64."""
    u = np.ascontiguousarray(trellis).view(np.uint16).astype(np.uint64)
    return u[..., 0::2] | (u[..., 1::2] << np.uint64(16))


def tile_states(trellis: np.ndarray) -> np.ndarray:
    """16-bit states of all 256 positions of every tile: [..., W] int16 -> [..., 256] uint16."""
    width = trellis.shape[-1]
    j, jp, shift = window_words(width)
    w = words32(trellis)
    both = (w[..., jp] << np.uint64(32)) | w[..., j]
    return ((both >> shift.astype(np.uint64)) & np.uint64(0xFFFF)).astype(np.uint16)


def untile(values: np.ndarray) -> np.ndarray:
    """Stream-ordered tile values [tk, tn, 256] -> the rotated-domain matrix [16 tk, 16 tn]."""
    tk, tn = values.shape[:2]
    r, c = position_rc()
    tiles = np.empty((tk, tn, 256), dtype=values.dtype)
    tiles[..., 16 * r + c] = values
    return tiles.reshape(tk, tn, 16, 16).transpose(0, 2, 1, 3).reshape(16 * tk, 16 * tn)


def decode_rotated(trellis: np.ndarray, codebook: int) -> np.ndarray:
    """Steps 1-6: trellis [tk, tn, W] -> W-hat [k, n] fp16 (bit-exact with exllamav3's reconstruct)."""
    check_width(trellis.shape[-1], codebook)
    return untile(lut(codebook)[tile_states(trellis)])


def signs_from_packed(packed: np.ndarray) -> np.ndarray:
    """Legacy su/sv: bit j of word w is the sign of element 16w+j (1 -> -1.0, 0 -> +1.0)."""
    u = np.ascontiguousarray(packed).view(np.uint16).astype(np.uint32)
    bits = (u[:, None] >> np.arange(16, dtype=np.uint32)[None, :]) & 1
    return (1.0 - 2.0 * bits).astype(np.float16).reshape(-1)


def iter_dequant(
    trellis: np.ndarray, suh: np.ndarray, svh: np.ndarray, codebook: int, rows: int = 1024
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (row0, W[row0:row0+rows] float32) blocks of the dense weight, each 128-row block tile by tile."""
    tk, tn, _ = trellis.shape
    k, n = 16 * tk, 16 * tn
    if k % BLOCK or n % BLOCK:
        raise Exl3FormatError(f"trellis {trellis.shape}: k={k} and n={n} must be multiples of 128")
    if suh.shape != (k,) or svh.shape != (n,):
        raise Exl3FormatError(f"suh {suh.shape} / svh {svh.shape} do not match k={k}, n={n}")
    rows = max(BLOCK, rows // BLOCK * BLOCK)
    for row0 in range(0, k, rows):
        block = np.concatenate([
            _tile_row(trellis, suh, svh, codebook, r) for r in range(row0, min(k, row0 + rows), BLOCK)
        ])  # fmt: skip
        yield row0, block


def _tile_row(trellis: np.ndarray, suh: np.ndarray, svh: np.ndarray, codebook: int, row0: int) -> np.ndarray:
    """W[row0:row0+128] float32: each 128 x 128 tile H W-hat H on its own (steps 7-8 in fp32), then the signs.

    A tile never reads its neighbours, so a TP rank's column slice has the bits of the same columns decoded
    whole, and every caller (the forward, `tfc dequant`, the kernels' references) gets one set of bits."""
    import torch

    what = torch.from_numpy(
        decode_rotated(trellis[row0 // 16 : row0 // 16 + BLOCK // 16], codebook).astype(np.float32)
    )
    n = what.shape[1]
    h = torch.from_numpy(hadamard128("float32"))
    tiles = what.reshape(BLOCK, n // BLOCK, BLOCK).transpose(0, 1).contiguous()
    tiles = torch.matmul(torch.matmul(h, tiles), h)  # [n/128, 128, 128]: the same batched GEMM for any k
    dense = tiles.transpose(0, 1).reshape(BLOCK, n)
    dense *= torch.from_numpy(suh[row0 : row0 + BLOCK].astype(np.float32))[:, None]
    dense *= torch.from_numpy(svh.astype(np.float32))[None, :]
    return dense.numpy()


def dequant(trellis: np.ndarray, suh: np.ndarray, svh: np.ndarray, codebook: int) -> np.ndarray:
    """The dense weight W [k, n] float32 = diag(suh) Hk W-hat Hn diag(svh), decoded tile by tile."""
    tk, tn, _ = trellis.shape
    out = np.empty((16 * tk, 16 * tn), dtype=np.float32)
    for row0, block in iter_dequant(trellis, suh, svh, codebook):
        out[row0 : row0 + block.shape[0]] = block
    return out
