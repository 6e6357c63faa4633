"""Launch choices of the EXL3 GEMM (GemmConfig, resolved from the shape) and what the GEMM and the MoE share:
k-splits, the SM count, arrival counters; where a grouped launch's groups lie (group_offsets)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from tfc.kernels.exl3.mma import mma_warps, split_rows
from tfc.kernels.exl3.tl import INTERPRET, next_pow2


@dataclass(frozen=True)
class GemmConfig:
    """Launch choices of the fused kernel (None = chosen from the shape by `resolved`) and the tuned values those
    choices follow (benchmarks/summaries/kernels.md)."""

    split: int | None = None  # programs along k per 128-column block
    block_k: int | None = None  # k rows decoded per loop iteration
    fuse_rotation: bool | None = None  # had128(x*suh) in the one-row run decode's kernel (n <= fuse_max_cols)
    use_dot: bool | None = None  # matrix units (rows padded to 16) instead of fp32 FMAs
    runs: bool | None = None  # integer width: 32-position runs from words loaded once (default, any rows)
    run_tiles: int | None = None  # run decode: n-tiles each element takes in turn (1, 2 or 4)
    num_warps: int | None = None  # 1-2 on the run decode, 4 for the gather and matrix units (see resolved)
    waves: float | None = None  # programs per SM the k-split aims for: see resolved (8 per mma group)
    # Weights decoded into mma from registers (exl3_mma), 2 mma n-tiles per warp per group: 1, 2 or 4 groups;
    # 0 = off; None = the default on integer widths (on a GPU; see mma_wide_weights) unless use_dot or runs is set.
    mma: int | None = None
    # Sum the k-split partials in a second launch, one program per (column block, row), instead of in the
    # last program of each column block (whose rows then queue behind each other); default: the run decode at
    # one row, the mma decode from 2 rows.
    reduce_apart: bool | None = None
    # mma decode: the decoded tile (transposed) is the mma's A operand and up to 8 rows its B operand, so one
    # mma per tile and half the sums at <= 8 rows; None = up to wt_max_rows rows
    mma_wt: bool | None = None
    # Every row's bits independent of how many rows the launch runs, so a decode step can run its live rows only
    # (concurrent == solo): on a GPU the mma decode with the weights as A at any rows, its inputs fp16 (never
    # high / low pairs), groups and k-split by the shape alone, the partials summed in the second launch;
    # elsewhere the matrix units on 16 padded rows.
    row_free: bool = False
    # Where the mma decode is not taken (the interpreter, use_dot / runs set, half-integer widths): up to this many
    # rows the run decode with fp32 FMAs is the default; above it the matrix units, which tie at 8 rows and win
    # at 16.
    run_rows_max: int = 4
    # One row fuses the input rotation (each program rotates its own k rows) up to this many output columns;
    # every 128-column block repeats that work, so wider matrices (the head) rotate once in a launch of their own.
    fuse_max_cols: int = 32768
    # On a GPU the mma decode is the default for integer widths from 2 rows, and at one row from this many weights
    # (wq_b, wo_b, the head; a routed expert keeps the one-row run decode). Up to wt_max_rows rows it takes the
    # decoded tile as the mma's A operand (mma_wt), 4 groups per warp from this many weights, else 1; above, x as
    # A with 4 groups above fuse_max_cols columns, 2 from this many weights, else 1.
    mma_wide_weights: int = 16 << 20
    wt_max_rows: int = 8
    # ... and on the head, with the weights as A, a k-split into this many programs per SM: about 4 waves of the
    # resident one-warp programs instead of 1, so the last wave's tail is short.
    wt_wide_waves: float = 128.0
    reduce_flight: int = 8  # partials the second launch sums at a time (its warps: this / 8)
    row_free_max_split: int = 64  # row_free launches: at most this k-split (fewer partials to sum; 0: none)

    def resolved(
        self, rows: int, width: int, cols: int = 0, depth: int = 0, ptx: bool = not INTERPRET
    ) -> GemmConfig:
        """This config with the defaults for `rows` input rows, trellis width, n = cols and k = depth filled in
        (split: at launch); ptx: inline PTX can run (a GPU, not the interpreter)."""
        mma = self.mma
        wt = self.mma_wt if self.mma_wt is not None else rows <= self.wt_max_rows or self.row_free
        if self.row_free and mma is None:
            mma = self.mma_groups(cols, depth, True) if ptx and width % 16 == 0 else 0
        if mma is None:
            auto = ptx and width % 16 == 0 and self.use_dot is None and self.runs is None
            auto = auto and (rows > 1 or cols * depth >= self.mma_wide_weights)
            mma = self.mma_groups(cols, depth, wt) if auto else 0
        if mma:  # one k-tile per step, 4 / mma warps, 8 mma programs per SM
            return replace(self, mma=mma, mma_wt=wt, use_dot=True, runs=False, block_k=16, run_tiles=1,
                           fuse_rotation=bool(self.fuse_rotation),
                           num_warps=mma_warps(mma), waves=self.waves or self.mma_waves(mma, wt, cols),
                           reduce_apart=self._apart(rows > 1))  # fmt: skip
        runs_ok = width % 16 == 0 and self.runs is not False
        fma_rows = rows <= self.run_rows_max and runs_ok and not self.row_free
        use_dot = self.use_dot if self.use_dot is not None else (rows > 1 and not fma_rows) or self.row_free
        runs = not use_dot and runs_ok
        mp = next_pow2(rows)
        # (block_k, tiles per element, warps, programs per SM): the H200's best
        # (benchmarks/summaries/kernels.md)
        if use_dot:  # 8 warps x 2/SM up to 4 rows; 4 warps x 4/SM at 8 and 16 rows
            many = rows > self.run_rows_max or self.row_free
            bk, tiles, warps, waves = (32, 4, 4, 4.0) if many else (32, 4, 8, 2.0)
        elif not runs:  # one row, half-integer width: the gather decode
            bk, tiles, warps, waves = 16, 4, 4, 8.0
        elif mp == 1:  # 4+ bits: one-warp programs, 32/SM (most warps in flight); 2-3 bits two-warp, 8/SM
            bk, tiles, warps, waves = (32, 4, 1, 32.0) if width >= 64 else (64, 4, 2, 8.0)
        elif mp <= self.run_rows_max:  # several rows: an element holds 2 MP sums a tile, 16 x MP inputs
            bk, tiles, warps, waves = 16, 2, 2, 8.0
        else:  # only when asked for (use_dot=False): fewer tiles keep the sums in registers
            bk, tiles, warps, waves = 16, 1, 2, 4.0
        return replace(
            self,
            use_dot=use_dot,
            runs=runs,
            block_k=self.block_k or bk,
            run_tiles=self.run_tiles or tiles,
            fuse_rotation=self.fuse_rotation
            if self.fuse_rotation is not None
            else runs and mp == 1 and cols <= self.fuse_max_cols,
            num_warps=self.num_warps or warps,
            waves=self.waves or waves,
            mma=0,
            mma_wt=False,
            reduce_apart=self._apart(runs and mp == 1),
        )

    def mma_waves(self, groups: int, wt: bool, cols: int) -> float:
        """Programs per SM the mma decode's k-split aims for: 8 per group, or wt_wide_waves with the weights as A
        above fuse_max_cols columns (the head: 1010 column blocks of one-warp programs, 28 of which fit an SM)."""
        return self.wt_wide_waves if wt and cols > self.fuse_max_cols else 8.0 * groups

    def mma_groups(self, cols: int, depth: int, wt: bool = False) -> int:
        """Default mma groups per warp: from mma_wide_weights weights 4 with weights as A, else 4 on the widest
        matrices and 2 below; 1 on smaller matrices."""
        wide = cols * depth >= self.mma_wide_weights
        if wt:
            return 4 if wide else 1
        if cols > self.fuse_max_cols:
            return 4
        return 2 if wide else 1

    def _apart(self, default: bool) -> bool:
        """reduce_apart: always for row_free launches (the last program's sums run in the product's warps, whose
        layout and order differ by shape; the second launch's are one order at any rows), else as set or
        `default`."""
        if self.row_free:
            return True
        return self.reduce_apart if self.reduce_apart is not None else default


def pinned_config(
    config: GemmConfig, rows: int, width: int, k: int, n: int, device: torch.device
) -> GemmConfig:
    """config resolved, k-split included, as exl3_gemm resolves it for x [rows, k] @ a k x n trellis of this
    width: a tensor-parallel rank's slice of that product, launched with it, computes every value it keeps
    with the same decode and the same k-split, so in the same order as the whole product (docs/parallel.md)."""
    cfg = config.resolved(rows, width, n, k)
    return replace(
        cfg, split=cfg.split or pick_split(k // 16, cfg.block_k // 16, n // 128, num_sms(device), cfg.waves)
    )


def input_pairs(cfg: GemmConfig, rows: int) -> bool:
    """Whether a resolved config carries the rotated input as fp16 high / low row pairs (mma_wt, <= 4 rows)."""
    return bool(cfg.mma) and split_rows(cfg.mma_wt, rows, not cfg.row_free)


def resolved_for(config: GemmConfig, rows: int, trellis_shape: tuple[int, ...]) -> GemmConfig:
    """config resolved for `rows` input rows times a trellis of this shape (tk, tn, W)."""
    tk, tn, width = trellis_shape
    return config.resolved(rows, width, 16 * tn, 16 * tk)


_COUNTERS: dict[tuple[str, int | None], list[torch.Tensor]] = {}
_SMS: dict[int | None, int] = {}


def counters(device: torch.device, n: int) -> torch.Tensor:
    """A zeroed int32 arrival-counter buffer of >= n entries for `device` (kernels leave it zeroed).

    Buffers are never freed (captured CUDA graphs keep their addresses); launches that run concurrently
    on different streams must not share one.
    """
    key = (device.type, device.index)
    bufs = _COUNTERS.setdefault(key, [])
    if not bufs or bufs[-1].numel() < n:
        bufs.append(torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device))
    return bufs[-1]


def group_offsets(
    trellises: list[torch.Tensor], suhs: list[torch.Tensor], svhs: list[torch.Tensor]
) -> torch.Tensor:
    """int64 [3, G] on their device: where each group's trellis (in int32 words), suh and svh (in halves) lie
    from group 0's, for exl3_gemm(..., groups=); the groups must share their shapes, dtypes and device."""
    shapes = {
        (tuple(t.shape), tuple(u.shape), tuple(v.shape))
        for t, u, v in zip(trellises, suhs, svhs, strict=True)
    }
    views = [*trellises, *suhs, *svhs]
    if len(shapes) != 1 or any(not t.is_contiguous() or t.device != views[0].device for t in views):
        raise ValueError("grouped EXL3 products need contiguous groups of one shape on one device")
    if {t.dtype for t in trellises} != {torch.int16} or {t.dtype for t in suhs + svhs} != {torch.float16}:
        raise ValueError("grouped EXL3 products need int16 trellises and float16 scales")
    rows = []
    for group, size in ((trellises, 4), (suhs, 2), (svhs, 2)):
        gaps = [t.data_ptr() - group[0].data_ptr() for t in group]
        if any(gap % size for gap in gaps):
            raise ValueError(
                f"grouped EXL3 products: group offsets {gaps} are not whole {size}-byte elements"
            )
        rows.append([gap // size for gap in gaps])
    if trellises[0].data_ptr() % 4:
        raise ValueError("grouped EXL3 products: the first trellis is not 4-byte aligned")
    return torch.tensor(rows, dtype=torch.int64, device=trellises[0].device)


def num_sms(device: torch.device) -> int:
    """Multiprocessor count (132 on an H200; a nominal 8 on the CPU interpreter)."""
    if device.type != "cuda":
        return 8
    if device.index not in _SMS:
        _SMS[device.index] = torch.cuda.get_device_properties(device).multi_processor_count
    return _SMS[device.index]


def pick_split(tk: int, bkt: int, blocks: int, sms: int, waves: float = 4.0, min_iters: int = 2) -> int:
    """Largest k-split (a divisor of the loop count) giving <= waves * sms programs, each >= min_iters."""
    iters = tk // bkt
    want = max(1, int(waves * sms) // blocks)
    best = 1
    for d in range(1, iters + 1):
        if iters % d == 0 and d <= want and iters // d >= min(min_iters, iters):
            best = d
    return best


def even_split(kt: int, blocks: int, sms: int, waves: float) -> int:
    """k-split (any count up to kt k-tiles, shared out as evenly as they go) giving <= waves * sms programs."""
    return max(1, min(kt, int(waves * sms) // blocks))


__all__ = [
    "GemmConfig",
    "counters",
    "even_split",
    "group_offsets",
    "input_pairs",
    "num_sms",
    "pick_split",
    "pinned_config",
    "resolved_for",
]
