"""The DeepSeek-V4.1 text forward over dense weights: embedding, 4 mHC streams, 40 blocks, head collapse, norm, head.

Reference: huggingface/transformers deepseek_v41 modeling at 0a2080b4 (`DeepseekV41TextModel.forward`,
`DeepseekV41DecoderLayer.forward`, `DeepseekV41ForCausalLM`). Per block l, streams S [T, hc, D]:

    S = engram(S, rows_l)                                       Engram layers only
    (pa, qa, ca) = mix_attn(S);  S = expand(attn(attn_norm(collapse(S, pre))), S, qa, ca)
    (pf, qf, cf) = mix_ffn(S);   S = expand(moe(ffn_norm(collapse(S, pa))), S, qf, cf);  pre = pf
    logits = norm(collapse(S, pre)) @ head                     pre starts one-hot on stream 0

Weights: a mapping from the pack's native names to tensors. EXL3 linears come decoded to dense
[in, out] under their group name (e.g. `layers.3.attn.wq_a`, `head`); natives as stored (norms
`.weight` [n], router `ffn.gate.weight` [E, D], `embed.weight` [V, D], mHC `hc_*`). DSpark blocks (`mtp.*`)
may be present; this forward does not run them (runtime/models/dsv41/dspark/drafter.py does), but `capture` hands
out what they read: the mean over the hc streams entering each listed block, after its Engram (docs/drafting.md).
Activations in `dtype` (fp32 by default) on `device`.

Decisions where sources differ: no `hc_head_*` HyperHead (HF V4.1 and the TensorFold V4.1 loader have
none; exllamav3's V4.1 carries the previous `pre` to its head): such tensors are ignored if present.
Top-k ties (router, indexer, candidate blocks) go to the lower index.

Numerics: activations (streams, module outputs, caches, logits) are in `dtype`; every module computes in
float64 and rounds its result to `dtype` (runtime/models/dsv41/reference/numerics.py), so an fp32 token's bits do not depend
on the batch or on chunking (the FP8/FP4 cache quantisers would amplify fp32 summation-order noise).

Tensor parallelism (`shard`, runtime/models/dsv41/shard.py): a rank holds its heads, wo_a groups, expert and
vocabulary columns; column-parallel linears run one 128-column block at a time and row-parallel ones (wo_b,
w2) sum 128-row block products as fixed-point integers, so a TP=N rank computes the TP=1 bits by construction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import overload

import torch
from tfc.runtime.models.dsv41.config import Dsv41Config
from tfc.runtime.models.dsv41.reference.attention import Segment, attention
from tfc.runtime.models.dsv41.reference.block import mhc_block
from tfc.runtime.models.dsv41.reference.csa import rms_norm
from tfc.runtime.models.dsv41.reference.engram import engram_apply, engram_qk
from tfc.runtime.models.dsv41.reference.mhc import first_pre, hc_collapse
from tfc.runtime.models.dsv41.reference.numerics import WIDE, column_linear
from tfc.runtime.models.dsv41.reference.rope import build_rope
from tfc.runtime.models.dsv41.reference.state import SequenceState
from tfc.runtime.models.dsv41.shard import Shard

from tfc.errors import TfcError


class MissingWeight(TfcError):
    """A tensor the forward needs is not in the weights."""


class EngramRowsMissing(TfcError):
    """An Engram layer ran without its table rows (pass rows, or build the model with engram=False)."""


class Dsv41Model:
    """The reference forward: a batch of sequences, each with its own state, any chunk length."""

    def __init__(
        self,
        config: Dsv41Config,
        weights: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        engram: bool = True,
        shard: Shard | None = None,
    ) -> None:
        self.config = config
        self.shard = shard or Shard()
        self.dtype = dtype
        self.device = torch.device(device)
        self.engram = engram and bool(config.engram_layer_ids)
        self.rope = build_rope(config)
        self._weights = weights
        self._held: dict[str, torch.Tensor] = {}

    def get(self, name: str) -> torch.Tensor:
        """A weight by pack name, in the activation dtype on the compute device (converted once)."""
        held = self._held.get(name)
        if held is None:
            raw = self._weights.get(name)
            if raw is None:
                # A linear stored as a native `.weight` [out, in] instead of a decoded group [in, out].
                native = self._weights.get(f"{name}.weight")
                if native is None:
                    raise MissingWeight(f"weights lack tensor {name!r} (DeepSeek-V4.1 forward)")
                raw = native.T
            held = self._held[name] = (
                torch.as_tensor(raw).to(device=self.device, dtype=self.dtype).contiguous()
            )
        return held

    def new_state(self) -> SequenceState:
        """An empty state for one new sequence."""
        return SequenceState()

    @overload
    def forward(
        self,
        tokens: Sequence[Sequence[int] | torch.Tensor],
        states: Sequence[SequenceState],
        engram_rows: Sequence[Mapping[int, torch.Tensor]] | None = None,
        last_only: bool = False,
        capture: None = None,
    ) -> list[torch.Tensor]: ...

    @overload
    def forward(
        self,
        tokens: Sequence[Sequence[int] | torch.Tensor],
        states: Sequence[SequenceState],
        engram_rows: Sequence[Mapping[int, torch.Tensor]] | None = None,
        last_only: bool = False,
        *,
        capture: Sequence[int],
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]: ...

    def forward(
        self,
        tokens: Sequence[Sequence[int] | torch.Tensor],
        states: Sequence[SequenceState],
        engram_rows: Sequence[Mapping[int, torch.Tensor]] | None = None,
        last_only: bool = False,
        capture: Sequence[int] | None = None,
    ) -> list[torch.Tensor] | tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Logits [n_i, V] (or [1, V] with last_only) of each sequence's new tokens; advances the states.

        engram_rows[i][layer] holds the looked-up table rows [n_i, cols, head_dim] of sequence i's new tokens.
        With `capture` (backbone layer ids, e.g. config.dspark_target_layer_ids) it returns (logits, hidden):
        hidden[i] [n_i (or 1), len(capture) * D] concatenates, in `capture` order, the mean of the hc streams
        entering each listed layer (after its Engram) - what the DSpark drafter reads. Logits are unchanged.
        """
        cfg = self.config
        if len(tokens) != len(states):
            raise ValueError(f"{len(tokens)} token chunks for {len(states)} states")
        taps: dict[int, list[torch.Tensor]] = {int(layer): [] for layer in capture or ()}
        if any(not 0 <= layer < cfg.num_hidden_layers for layer in taps):
            raise ValueError(f"capture layers {list(taps)} must lie in [0, {cfg.num_hidden_layers})")
        ids = [torch.as_tensor(t, dtype=torch.long).reshape(-1).to(self.device) for t in tokens]
        segments, start = [], 0
        for chunk, state in zip(ids, states, strict=True):
            segments.append(Segment(start, start + chunk.numel(), state))
            start += chunk.numel()
        flat = torch.cat(ids)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= cfg.vocab_size):
            raise ValueError(f"token ids must lie in [0, {cfg.vocab_size})")
        positions = torch.cat(
            [
                torch.arange(s.state.position, s.state.position + s.end - s.start, device=self.device)
                for s in segments
            ]
        )
        hidden = self.shard.embed(self.get("embed.weight"), flat)
        streams = hidden.unsqueeze(-2).expand(-1, cfg.hc_mult, -1).contiguous()
        pre = first_pre((flat.numel(),), cfg.hc_mult, self.dtype, self.device)
        for layer in range(cfg.num_hidden_layers):
            streams, pre = self._block(layer, streams, pre, positions, segments, engram_rows, taps.get(layer))
        out = rms_norm(hc_collapse(streams, pre), self.get("norm.weight"), cfg.rms_norm_eps)
        last = [s.end - 1 for s in segments]
        if last_only:
            out = out[last]
        head_rows = self.shard.gather_last(column_linear(out, self.get("head")), self.shard.vocab)
        logits = self._per_sequence(head_rows, segments, last_only)
        for seg, chunk in zip(segments, ids, strict=True):
            seg.state.position += chunk.numel()
            seg.state.tokens.extend(chunk.tolist())
        if capture is None:
            return logits
        parts = [t for layer in capture for t in taps[int(layer)]]
        hidden = torch.cat(parts, dim=-1) if parts else streams.new_empty(streams.shape[0], 0)
        return logits, self._per_sequence(hidden[last] if last_only else hidden, segments, last_only)

    @staticmethod
    def _per_sequence(rows: torch.Tensor, segments: list[Segment], last_only: bool) -> list[torch.Tensor]:
        """Flat per-token rows [T, ...] (or one per sequence) split into each sequence's part."""
        if last_only:
            return list(rows.unsqueeze(1).unbind(0))
        return list(rows.split([s.end - s.start for s in segments]))

    def _block(
        self,
        layer: int,
        streams: torch.Tensor,
        pre: torch.Tensor,
        positions: torch.Tensor,
        segments: list[Segment],
        engram_rows: Sequence[Mapping[int, torch.Tensor]] | None,
        tap: list[torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg, get, b = self.config, self.get, f"layers.{layer}"
        mode = cfg.layer_mode(layer)
        if mode.engram and self.engram:
            streams = self._engram(layer, streams, segments, engram_rows)
        if tap is not None:
            tap.append(streams.to(WIDE).mean(-2).to(streams.dtype))
        return mhc_block(
            cfg, get, b, streams, pre, lambda x: attention(x, positions, segments, mode, cfg, get, self.rope, self.shard),
            cfg.n_routed_experts, cfg.num_experts_per_tok, self.shard.reduce,
        )  # fmt: skip

    def _engram(
        self,
        layer: int,
        streams: torch.Tensor,
        segments: list[Segment],
        engram_rows: Sequence[Mapping[int, torch.Tensor]] | None,
    ) -> torch.Tensor:
        cfg, b = self.config, f"layers.{layer}.engram"
        if (
            engram_rows is None
            or len(engram_rows) != len(segments)
            or any(layer not in r for r in engram_rows)
        ):
            raise EngramRowsMissing(
                f"Engram layer {layer} has no table rows (tables absent: use --no-engram)"
            )
        rows = torch.cat([torch.as_tensor(r[layer]) for r in engram_rows]).to(self.device, self.dtype)
        want = (streams.shape[0], cfg.engram_cols, cfg.engram_head_dim)
        if tuple(rows.shape) != want:
            raise EngramRowsMissing(f"Engram layer {layer}: rows {tuple(rows.shape)}, expected {want}")
        qk = self._held.get(f"{b}.qk")
        if qk is None:
            if f"{b}.qk" in self._weights:
                qk = self.get(f"{b}.qk")
            else:
                qk = engram_qk(self.get(f"{b}.q_weight"), self.get(f"{b}.k_weight"))
                self._held[f"{b}.qk"] = qk
        return engram_apply(
            streams, rows, self.get(f"{b}.wkv"), qk, eps=cfg.rms_norm_eps, clamp=cfg.engram_gate_clamp
        )
