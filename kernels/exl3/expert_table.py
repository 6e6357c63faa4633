"""ExpertTable: one projection's EXL3 expert table on a device (contracts "Expert tables"), validated once."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from tfc.kernels.exl3.reference import Exl3FormatError, check_width

LAYOUT_IDS = {"stack": "exl3.experts.stack.v1", "ragged": "exl3.experts.ragged.v1"}
ALIGN = 16


@dataclass(frozen=True)
class ExpertTable:
    """E routed entries then the shared expert (last); entry e is an EXL3 linear [k, n] of width widths[e].

    stack: trellis int16 [E+1, tk, tn, W]; ragged: trellis uint8 [bytes], entries 16-byte aligned.
    `width_set` holds the distinct widths; `width` / `codebook` are the common values (0 / -1 when entries
    differ), all read on the host once.
    """

    layout: str
    trellis: torch.Tensor
    offsets: torch.Tensor  # int64 [E+1], byte offset of each entry
    widths: torch.Tensor  # int32 [E+1], int16 words per 16x16 tile
    codebooks: torch.Tensor  # int32 [E+1]: 0 3inst, 1 mcg, 2 mul1
    suh: torch.Tensor  # float16 [E+1, k]
    svh: torch.Tensor  # float16 [E+1, n]
    k: int
    n: int
    codebook: int
    width_set: tuple[int, ...]  # the entries' distinct widths, ascending (read on the host once)

    @property
    def width(self) -> int:
        """The entries' common width, or 0 when they differ."""
        return self.width_set[0] if len(self.width_set) == 1 else 0

    @property
    def integer_widths(self) -> bool:
        """Every entry's width is a whole number of bits (16 K words)."""
        return all(w % 16 == 0 for w in self.width_set)

    @property
    def entries(self) -> int:
        """E + 1 (the shared expert included)."""
        return self.offsets.numel()

    @property
    def words(self) -> torch.Tensor:
        """The trellis bytes as a flat int32 view (what the kernels read)."""
        return self.trellis.reshape(-1).view(torch.int32)

    @classmethod
    def from_tensors(
        cls,
        layout: str,
        trellis: torch.Tensor,
        offsets: torch.Tensor,
        widths: torch.Tensor,
        codebooks: torch.Tensor,
        suh: torch.Tensor,
        svh: torch.Tensor,
    ) -> ExpertTable:
        """Check a table's tensors against each other (hostile input: offsets, widths, sizes)."""
        if layout not in LAYOUT_IDS:
            raise Exl3FormatError(f"expert table layout {layout!r} is not one of {sorted(LAYOUT_IDS)}")
        entries = offsets.numel()
        if suh.dim() != 2 or svh.dim() != 2 or suh.shape[0] != entries or svh.shape[0] != entries:
            raise Exl3FormatError(
                f"suh {tuple(suh.shape)} / svh {tuple(svh.shape)} do not hold {entries} entries"
            )
        if suh.dtype != torch.float16 or svh.dtype != torch.float16:
            raise Exl3FormatError(f"suh/svh must be float16, not {suh.dtype}/{svh.dtype}")
        k, n = suh.shape[1], svh.shape[1]
        if k % 128 or n % 128 or k == 0 or n == 0:
            raise Exl3FormatError(f"expert slice {k}x{n} is not made of 128-blocks")
        offs = offsets.cpu().numpy().astype(np.int64)
        wids = widths.cpu().numpy().astype(np.int64)
        cbs = codebooks.cpu().numpy().astype(np.int64)
        if widths.numel() != entries or codebooks.numel() != entries:
            raise Exl3FormatError(
                f"offsets/widths/codebooks lengths differ ({entries}, {wids.size}, {cbs.size})"
            )
        if layout == "stack":
            if trellis.dtype != torch.int16 or tuple(trellis.shape[:3]) != (entries, k // 16, n // 16):
                raise Exl3FormatError(
                    f"stack trellis {tuple(trellis.shape)} is not [{entries}, {k // 16}, {n // 16}, W]"
                )
        elif trellis.dtype != torch.uint8 or trellis.dim() != 1:
            raise Exl3FormatError(
                f"ragged trellis must be a flat uint8 blob, not {trellis.dtype} {tuple(trellis.shape)}"
            )
        if not trellis.is_contiguous():
            raise Exl3FormatError("expert table trellis must be contiguous")
        total = trellis.numel() * trellis.element_size()
        for e in range(entries):
            if not 0 <= cbs[e] <= 2:
                raise Exl3FormatError(f"entry {e}: codebook id {cbs[e]} is not 0, 1 or 2")
            check_width(int(wids[e]), int(cbs[e]))
            size = (k // 16) * (n // 16) * int(wids[e]) * 2
            if offs[e] % ALIGN or offs[e] < 0 or offs[e] + size > total:
                raise Exl3FormatError(
                    f"entry {e}: offset {offs[e]} (+{size} bytes) is unaligned or outside {total}"
                )
        if layout == "stack" and (len(set(wids.tolist())) != 1 or trellis.shape[3] != wids[0]):
            raise Exl3FormatError(
                f"stack table widths {sorted(set(wids.tolist()))} differ from W={trellis.shape[3]}"
            )
        codebook = int(cbs[0]) if len(set(cbs.tolist())) == 1 else -1
        width_set = tuple(sorted({int(w) for w in wids.tolist()}))
        return cls(layout, trellis, offsets, widths, codebooks, suh, svh, k, n, codebook, width_set)

    @classmethod
    def build(
        cls,
        groups: Sequence[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]],
        layout: str = "auto",
        device: torch.device | str | None = None,
    ) -> ExpertTable:
        """Pack (trellis [tk, tn, W] int16, suh, svh, codebook) entries, shared expert last, into a table."""
        widths = [int(g[0].shape[-1]) for g in groups]
        if layout == "auto":
            layout = "stack" if len(set(widths)) == 1 else "ragged"
        device = torch.device(device) if device is not None else groups[0][0].device
        suh = torch.stack([g[1] for g in groups]).to(device=device, dtype=torch.float16)
        svh = torch.stack([g[2] for g in groups]).to(device=device, dtype=torch.float16)
        codebooks = torch.tensor([g[3] for g in groups], dtype=torch.int32, device=device)
        if layout == "stack":
            trellis = torch.stack([g[0] for g in groups]).to(device).contiguous()
            size = trellis[0].numel() * 2
            offsets = torch.arange(len(groups), dtype=torch.int64) * size
        else:
            offs, pos = [], 0
            for g in groups:
                pos = -(-pos // ALIGN) * ALIGN
                offs.append(pos)
                pos += g[0].numel() * 2
            trellis = torch.zeros(pos, dtype=torch.uint8, device=device)
            for g, off in zip(groups, offs, strict=True):
                raw = g[0].contiguous().reshape(-1).view(torch.uint8)
                trellis[off : off + raw.numel()] = raw.to(device)
            offsets = torch.tensor(offs, dtype=torch.int64)
        offsets = offsets.to(device)
        widths_t = torch.tensor(widths, dtype=torch.int32, device=device)
        return cls.from_tensors(layout, trellis, offsets, widths_t, codebooks, suh, svh)
