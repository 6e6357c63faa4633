"""DeepSeek-V4.1 Engram gate and value: looked-up table rows -> engram.wkv -> one gated value per stream.

Reference: huggingface/transformers deepseek_v41 modeling at 0a2080b4 (`DeepseekV41Engram.forward`), as
spec/engram.md section 9 describes. Per token, with E the concatenated rows [cols * head_dim]:

    [k_0 .. k_{hc-1}, v] = E @ wkv                         keys first (hc x D), then the shared value (D)
    dot_i = sum_d h_i[d] q_i[d] k_i[d] * rsqrt(mean h_i^2 + eps) * rsqrt(mean k_i^2 + eps) / sqrt(D)
    g_i   = sigmoid(sign(dot_i) * sqrt(max(|dot_i|, clamp)))   (0 where the token is masked)
    h_i  <- h_i + g_i * v

q_i = q_weight[i] * k_weight[i] (only ever used as a product; an image may store it pre-multiplied as
`engram.qk`). eps = rms_norm_eps, clamp = 1e-6. Applied at the start of the layer, before its mHC mix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from tfc.runtime.models.dsv41.reference.numerics import wide


def engram_qk(q_weight: torch.Tensor, k_weight: torch.Tensor) -> torch.Tensor:
    """The gate's per-stream channel weights [hc, D] (in the inputs' dtype)."""
    return q_weight * k_weight


@wide
def engram_apply(
    streams: torch.Tensor,
    rows: torch.Tensor,
    wkv: torch.Tensor,
    qk: torch.Tensor,
    *,
    eps: float,
    clamp: float = 1e-6,
    token_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Streams [T, hc, D] after the Engram add, from rows [T, cols, head_dim] and wkv [cols*head_dim, (hc+1)*D]."""
    t, hc, d = streams.shape
    kv = rows.reshape(t, -1) @ wkv
    key = kv[:, : hc * d].reshape(t, hc, d)
    value = kv[:, hc * d :]
    rstd = torch.rsqrt(streams.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
    dot = (streams * qk * key).sum(-1) * rstd * d**-0.5
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(clamp).sqrt(), dot))
    if token_mask is not None:
        gate = gate.masked_fill(~token_mask.unsqueeze(-1), 0.0)
    return streams + gate.unsqueeze(-1) * value.unsqueeze(-2)


class EngramFeed:
    """Table rows of each new chunk: token ids -> hasher row ids -> gathered rows, per Engram layer.

    `hash_rows(ids, lookback)` returns int64 row ids [n, layers, cols] (e.g. runtime.engram_hash.hash_ids);
    `gather(k, row_ids [n, c])` returns the k-th Engram layer's rows [n, c, head_dim]. A TP rank's feed
    gathers only its columns `cols` = [start, stop) (its table shard holds only their rows).
    """

    def __init__(
        self,
        layer_ids: tuple[int, ...],
        max_ngram: int,
        hash_rows: Callable[[Sequence[int], Sequence[int]], np.ndarray],
        gather: Callable[[int, torch.Tensor], torch.Tensor],
        cols: tuple[int, int] | None = None,
    ) -> None:
        self.layer_ids = layer_ids
        self.max_ngram = max_ngram
        self.hash_rows = hash_rows
        self.gather = gather
        self.cols = cols

    def rows(self, previous: Sequence[int], ids: Sequence[int]) -> dict[int, torch.Tensor]:
        """Rows of `ids`, which follow the sequence's earlier tokens `previous`, for each Engram layer."""
        back = list(previous)[len(previous) - min(len(previous), self.max_ngram - 1) :]
        row_ids = torch.as_tensor(np.asarray(self.hash_rows(list(ids), back), dtype=np.int64))
        if self.cols is not None:
            row_ids = row_ids[..., self.cols[0] : self.cols[1]]
        return {layer: self.gather(k, row_ids[:, k]) for k, layer in enumerate(self.layer_ids)}
