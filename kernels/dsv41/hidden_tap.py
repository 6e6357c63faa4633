"""The drafter's tap of a layer's hc streams as one Triton launch: out [R, D] = the float64 mean of streams
[R, S, D] over S, rounded to fp32, written in place (runtime/models/dsv41/fast/fp32.stream_tap; torch takes four
launches: the widening copy, the mean, the narrowing copy, the copy into the step's hidden rows).

The sum runs in torch's order (0 + s_0 + s_1 + ... in float64), then times 1/S in float64 (torch's MeanOps), then
rounds to fp32 (to nearest), so the bits are torch's. One program a row's `TapConfig.block` columns: a row reads only its own
streams. Launches only (CUDA-graph safe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class TapConfig:
    """Launch values of the tap (any of them gives the same bits)."""

    block: int = 1024  # columns a program


@triton.jit
def _tap_kernel(s_ptr, out_ptr, D, stride_out, S: tl.constexpr, BLOCK: tl.constexpr):
    """Row r's columns [BLOCK * c, BLOCK * (c + 1)): the float64 mean of its S streams, to fp32."""
    r, c = tl.program_id(0).to(tl.int64), tl.program_id(1)
    cols = c * BLOCK + tl.arange(0, BLOCK)
    ok = cols < D
    acc = tl.zeros([BLOCK], dtype=tl.float64)
    for s in tl.static_range(S):
        acc = acc + tl.load(s_ptr + (r * S + s) * D + cols, mask=ok, other=0.0).to(tl.float64)
    mean = acc * (tl.full([BLOCK], 1.0, tl.float64) / S)
    tl.store(out_ptr + r * stride_out + cols, mean.to(tl.float32), mask=ok)


def stream_mean_into(streams: torch.Tensor, out: torch.Tensor, config: TapConfig = TapConfig()) -> None:
    """out [R, D] (fp32, rows any stride, columns contiguous) = streams fp32 [R, S, D].double().mean(1).float()."""
    if streams.dim() != 3 or streams.dtype != torch.float32 or out.dtype != torch.float32:
        raise ValueError(f"stream_mean_into takes fp32 [R, S, D] into fp32 [R, D]: {streams.dtype} "
                         f"{tuple(streams.shape)} into {out.dtype} {tuple(out.shape)}")  # fmt: skip
    rows, s, d = streams.shape
    if out.shape != (rows, d) or (d > 1 and out.stride(1) != 1):
        raise ValueError(
            f"stream_mean_into: out {tuple(out.shape)} (strides {out.stride()}) is not [{rows}, {d}]"
        )
    if rows:
        _tap_kernel[(rows, triton.cdiv(d, config.block))](streams.contiguous(), out, d, out.stride(0), S=s,
                                                          BLOCK=config.block, num_warps=4)  # fmt: skip
