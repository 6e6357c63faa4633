"""DeepSeek-V4.1's cached-row formats as bytes: FP8 window rows, FP4 compressed entries and FP4 indexer keys.

Each packs exactly what the reference's fake quantisers (runtime/models/dsv41/reference/quant.py) compute, so
unpack(pack(x)) equals fake_quant(x) bit for bit:

    window row   n e4m3 bytes, then n/32 UE8M0 scale bytes                    fake_quant_fp8(x, 32)
    entry        n/2 bytes of e2m1 codes (low nibble first), then n/16 e4m3 scales   fake_quant_fp4(x, 16, e4m3)
    index key    n/2 bytes of e2m1 codes, then n/32 UE8M0 scale bytes          fake_quant_fp4(x, 32)

A UE8M0 byte b is the scale 2**(b - 127). Every op is a fixed-shape torch op on the device (no host
reads, no allocation of host data), so the packers run inside captured graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from tfc.runtime.models.dsv41.reference.quant import FP4_MAX, FP8_MAX, e4m3_block_scale

_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


@dataclass(frozen=True)
class RowFormat:
    """One row format: values per row, the bytes of its codes and of its scales."""

    name: str
    values: int
    code_bytes: int
    scale_bytes: int

    @property
    def nbytes(self) -> int:
        """Bytes of one row."""
        return self.code_bytes + self.scale_bytes


def fp8_row(n: int) -> RowFormat:
    """The window row of n values: e4m3 with a UE8M0 scale per 32."""
    return RowFormat("fp8.e4m3.ue8m0x32", n, n, n // 32)


def fp4_entry(n: int) -> RowFormat:
    """The compressed entry of n values: e2m1 with an e4m3 scale per 16."""
    return RowFormat("fp4.e2m1.e4m3x16", n, n // 2, n // 16)


def fp4_key(n: int) -> RowFormat:
    """The indexer key of n values: e2m1 with a UE8M0 scale per 32."""
    return RowFormat("fp4.e2m1.ue8m0x32", n, n // 2, n // 32)


class Fp4Grid:
    """The e2m1 grid and the 16-code value table on one device (built once: no host data inside a graph)."""

    _held: ClassVar[dict[tuple[str, int | None], Fp4Grid]] = {}

    def __init__(self, device: torch.device) -> None:
        grid = torch.tensor(_E2M1, dtype=torch.float32)
        self.values = grid.to(device)
        self.odd = (torch.arange(len(_E2M1)) % 2).to(device)
        table = torch.cat((grid, -grid))  # code = magnitude index | sign << 3
        self.table = table.to(device)
        byte = torch.arange(256)
        self.pairs = torch.stack((table[byte & 15], table[byte >> 4]), dim=-1).to(
            device
        )  # byte -> its 2 values

    @classmethod
    def on(cls, device: torch.device) -> Fp4Grid:
        """The grid of a device, made on first use (before any capture: the runner warms it up)."""
        key = (device.type, device.index)
        if key not in cls._held:
            cls._held[key] = cls(device)
        return cls._held[key]


def pow2_exponent(t: torch.Tensor) -> torch.Tensor:
    """E with 2**E = 2**ceil(log2(t)) for positive normal fp32 t (the reference's pow2_ceil), int32."""
    mantissa, exponent = torch.frexp(t)
    return torch.where(mantissa == 0.5, exponent - 1, exponent)


def _ue8m0(exponent: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale 2**E as fp32, its UE8M0 byte)."""
    scale = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent)
    return scale, (exponent + 127).to(torch.uint8)


def ue8m0_values(b: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> fp32 2**(b - 127) from the exponent bits."""
    return (b.to(torch.int32) << 23).view(torch.float32)


def e2m1_codes(q: torch.Tensor, grid: Fp4Grid) -> torch.Tensor:
    """4-bit codes of fp32 values inside [-6, 6]: nearest e2m1 magnitude, ties to the even code, sign in bit 3."""
    dist = (q.abs().unsqueeze(-1) - grid.values).abs()
    nearest = dist == dist.amin(-1, keepdim=True)
    mag = ((~nearest).to(torch.int64) * 2 + grid.odd).argmin(-1)
    return mag | (torch.signbit(q).to(torch.int64) << 3)


def pack_fp8(x: torch.Tensor) -> torch.Tensor:
    """Window rows [..., n] -> uint8 [..., n + n/32]."""
    n = x.shape[-1]
    b = x.float().reshape(*x.shape[:-1], n // 32, 32)
    scale, sbyte = _ue8m0(pow2_exponent(b.abs().amax(-1).clamp_min(1e-4) * (1.0 / FP8_MAX)))
    q = (b / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return torch.cat((q.view(torch.uint8).reshape(*x.shape[:-1], n), sbyte), dim=-1)


def unpack_fp8(rows: torch.Tensor, n: int) -> torch.Tensor:
    """uint8 window rows [..., n + n/32] -> fp32 [..., n]."""
    q = rows[..., :n].contiguous().view(torch.float8_e4m3fn).float()
    scale = ue8m0_values(rows[..., n:])
    return (q.reshape(*q.shape[:-1], n // 32, 32) * scale.unsqueeze(-1)).reshape(q.shape)


def pack_fp4(x: torch.Tensor, block: int, e4m3_scale: bool, grid: Fp4Grid) -> torch.Tensor:
    """Entries (block 16, e4m3 scales) or index keys (block 32, UE8M0 scales) [..., n] -> uint8 rows."""
    n = x.shape[-1]
    b = x.float().reshape(*x.shape[:-1], n // block, block)
    amax = b.abs().amax(-1)
    if e4m3_scale:
        s8 = e4m3_block_scale(amax)
        scale, sbyte = s8.float(), s8.view(torch.uint8)
    else:
        scale, sbyte = _ue8m0(pow2_exponent(amax.clamp_min(FP4_MAX * 2.0**-126) * (1.0 / FP4_MAX)))
    codes = e2m1_codes((b / scale.unsqueeze(-1)).clamp(-FP4_MAX, FP4_MAX), grid).reshape(*x.shape[:-1], n)
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)
    return torch.cat((packed, sbyte), dim=-1)


def unpack_fp4(rows: torch.Tensor, n: int, block: int, e4m3_scale: bool, grid: Fp4Grid) -> torch.Tensor:
    """uint8 FP4 rows -> fp32 [..., n] (the value table's product with the block scale, exact in fp32)."""
    sb = rows[..., n // 2 :]
    scale = sb.contiguous().view(torch.float8_e4m3fn).float() if e4m3_scale else ue8m0_values(sb)
    q = grid.pairs[rows[..., : n // 2].to(torch.int64)].reshape(*rows.shape[:-1], n // block, block)
    return (q * scale.unsqueeze(-1)).reshape(*rows.shape[:-1], n)


def fake_fp4(x: torch.Tensor, block: int, grid: Fp4Grid) -> torch.Tensor:
    """The indexer query's FP4 step (UE8M0 per `block`), as values: unpack(pack(x))."""
    return unpack_fp4(pack_fp4(x, block, False, grid), x.shape[-1], block, False, grid)
