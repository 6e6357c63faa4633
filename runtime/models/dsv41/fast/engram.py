"""Fast Engram of one step: the rows the host hashed, gathered from the uploaded table shard (or, for a table
placed off the device, from the step's staged records: fast/engram_staging.py), then the gate.

The maths of runtime/models/dsv41/reference/engram.py `engram_apply` in fp32: rows (bf16 from the e4m3 + e8m0 records,
widened) -> engram.wkv (EXL3) -> hc keys and one value; each stream gets sigmoid(signed sqrt of its scaled
dot with its key) times the value. The row ids come in the step's static inputs (hashed on the host over
each slot's history while the previous step runs on the device; a tensor-parallel rank gets its own hash
columns' ids and gathers the other ranks' rows).
"""

from __future__ import annotations

import torch
from tfc.runtime.models.dsv41.fast.stages import fused


@fused(kernel="tfc.kernels.dsv41.mhc_stages:engram_gate")
def engram_gate(
    streams: torch.Tensor, kv: torch.Tensor, qk: torch.Tensor, eps: float, clamp: float
) -> torch.Tensor:
    """Streams [R, hc, D] plus each one's gated share of the value, from kv [R, (hc + 1) * D]."""
    r, hc, d = streams.shape
    key, value = kv[:, : hc * d].reshape(r, hc, d), kv[:, hc * d :]
    rstd = torch.rsqrt(streams.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
    dot = (streams * qk * key).sum(-1) * rstd * d**-0.5
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(clamp).sqrt(), dot))
    return streams + gate.unsqueeze(-1) * value.unsqueeze(-2)


def engram(f, layer: int, k: int, streams: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Streams [R, hc, D] after Engram layer `layer` (the k-th), from global row ids [R, cols]."""
    cfg = f.cfg
    # rows off the device: this step's records, staged (engram_staging.py)
    if f.staging is not None and k in f.staging:
        table, row_lo = f.staging.table(k), 0
    else:
        table, row_lo = f.weights.engram_table(layer, k)
    rows = f.ops.engram_rows(table, ids, cfg.engram_head_dim, row_lo)
    rows = (rows if f.tp is None else f.tp.engram_rows(rows)).float()
    kv = f.lin(rows, f"layers.{layer}.engram.wkv")
    qk = f.weights.native(f"layers.{layer}.engram.qk")
    return engram_gate(streams, kv, qk, cfg.rms_norm_eps, cfg.engram_gate_clamp)
