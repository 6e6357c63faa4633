"""One fixed-shape step of the DeepSeek-V4.1 forward over static buffers: the body a graph captures.

Reads the static inputs (tokens, positions, slots, Engram row ids [rows, layers, cols]), the arena's weights and
the KV memory; writes the KV memory and the static logits [rows, V]. With exact ops every tensor of a decode
step has the key's rows rounded up to whole 16-row chunks (the prefill forward's: its buffers' rows; padding
rows run on the dummy slot), every product runs 16-row chunks of them (ops.by_chunks) and only the MoE runs the
key's `rows`, so a row's bits depend neither on the step's rows nor on its place; otherwise the whole step runs
the key's rows. The launch sequence depends on the key alone, so replay equals eager.

With `tp` (a tensor-parallel rank, or TP=1 computing as one: fast/tp.py) the column-parallel products run pinned
to the whole product, the row-parallel ones as fixed-point words all-reduced over the shard's world.

With `capture` (the DSpark target layers) the step also writes the static hidden rows [rows, len(capture) * D]:
per listed layer, in that order, the mean of the hc streams entering it after its Engram (the reference's
`capture`, docs/drafting.md: a float64 mean rounded to fp32), what the drafter reads of committed positions.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from tfc.runtime.models.dsv41.config import Dsv41Config
from tfc.runtime.models.dsv41.fast.attention import attention
from tfc.runtime.models.dsv41.fast.engram import engram
from tfc.runtime.models.dsv41.fast.fp32 import collapse_norm, first_pre, hc_expand, hc_mix, stream_tap
from tfc.runtime.models.dsv41.fast.graph_keys import MAX_ROWS, StepKey, chunked_rows
from tfc.runtime.models.dsv41.fast.kv.memory import KvMemory
from tfc.runtime.models.dsv41.fast.kv.rows import Fp4Grid
from tfc.runtime.models.dsv41.fast.moe import moe
from tfc.runtime.models.dsv41.fast.rope import RopeTables
from tfc.runtime.models.dsv41.fast.step_context import step_context
from tfc.runtime.models.dsv41.fast.step_plan import Tile
from tfc.runtime.models.dsv41.fast.tp import TpProducts
from tfc.runtime.models.dsv41.fast.weights import FastWeights
from tfc.runtime.models.dsv41.shard import Shard


class StepBuffers:
    """The static inputs (one int64 block) and outputs of a step, with a host twin the inputs are staged in."""

    def __init__(self, vocab: int, engram_layers: int, engram_cols: int, device: torch.device, hidden: int = 0,
                 rows: int = MAX_ROWS) -> None:  # fmt: skip
        self.rows = rows
        n = 3 * rows + rows * engram_layers * engram_cols
        self.ints = torch.zeros(n, dtype=torch.int64, device=device)
        pin = device.type == "cuda"
        self.host = torch.zeros(n, dtype=torch.int64, pin_memory=pin)
        self.tokens, self.positions, self.slots = (
            self.ints[:rows],
            self.ints[rows : 2 * rows],
            self.ints[2 * rows : 3 * rows],
        )
        self.engram = self.ints[3 * rows :].view(rows, engram_layers, engram_cols)
        self.logits = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
        self.hidden = torch.zeros(rows, hidden, dtype=torch.float32, device=device) if hidden else None

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The device buffers (what a graph bakes in)."""
        return [self.ints, self.logits] + ([] if self.hidden is None else [self.hidden])

    def load(self, tile: Tile, engram_ids: np.ndarray | None) -> None:
        """Stage a tile's inputs on the host and copy them in with one copy (synchronous for the host side)."""
        h = self.host.numpy()
        rows = self.rows
        h[:rows], h[rows : 2 * rows], h[2 * rows : 3 * rows] = tile.tokens, tile.positions, tile.slots
        if engram_ids is not None:
            h[3 * rows :] = engram_ids.reshape(-1)
        self.ints.copy_(self.host)


# Rows a prefill step's head takes at a time (the rows read, the last repeated to fill).
HEAD_ROWS = 16


def head_rows(rows: list[int]) -> list[int]:
    """`rows` with its last repeated up to a multiple of HEAD_ROWS (none: none)."""
    return rows + rows[-1:] * (-len(rows) % HEAD_ROWS)


class FastForward:
    """The step body: embedding, the backbone layers, HyperHead collapse, norm, head."""

    def __init__(self, cfg: Dsv41Config, weights: FastWeights, ops, kv: KvMemory, rope: RopeTables,
                 buffers: StepBuffers, engram: bool, capture: tuple[int, ...] = (), shard: Shard | None = None,
                 tp: bool = False, wide: bool = False) -> None:  # fmt: skip
        width = len(capture) * cfg.hidden_size
        if capture and (buffers.hidden is None or buffers.hidden.shape[1] != width):
            raise ValueError(
                f"capturing layers {list(capture)} needs step buffers with {width} hidden columns"
            )
        self.cfg = cfg
        self.capture = tuple(capture)
        self.weights = weights
        self.ops = ops
        self.kv = kv
        self.rope = rope
        self.buffers = buffers
        self.engram = engram and bool(cfg.engram_layer_ids)
        self.grid = Fp4Grid.on(kv.device)
        self.ratios = tuple(sorted({s.ratio for s in kv.layout.sources}))
        self.trace: list[torch.Tensor] | None = None  # eager runs only: each layer's output streams
        self.routes: list | None = None  # eager runs only: (layer, expert ids) of the live rows
        self.shard = shard or Shard()
        self.tp = TpProducts(cfg, ops, self.shard, kv.device) if tp or self.shard.world > 1 else None
        self.live: int | None = None  # inside a step: its live rows when fewer than its rows (see lin)
        self.side: torch.cuda.Stream | None = None  # the stream of a layer's side branch (fast/overlap.py)
        self.staging = None  # the Engram layers whose rows are off the device (fast/engram_staging.py)
        self.wide = wide  # the prefill forward: exact steps run all its buffers' rows

    def engram_span(self) -> tuple[int, int]:
        """[first, last) of the Engram hash columns this rank gathers rows of (all of them at TP=1)."""
        cols = self.shard.engram_cols
        return cols[self.shard.rank] if cols else (0, self.cfg.engram_cols)

    def lin(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """x @ the EXL3 group `name`, fp32 (inside a step whose live rows are fewer than its rows, the rows after
        them zeros: their partial sums are skipped)."""
        return self.ops.linear(x, self.weights.linear(name), self.live)

    def step(self, key: StepKey, head_rows: torch.Tensor | None = None) -> None:
        """Run the step of `key` on the static inputs; logits land in buffers.logits[:rows] (with `head_rows`, a
        device index of rows, a multiple of HEAD_ROWS long, in those rows only: a prefill step reads its runs'
        last rows)."""
        rows = key.rows
        if self.ops.exact:
            rows = self.buffers.rows if self.wide else chunked_rows(key.rows)
        self.live = key.rows if key.rows < rows else None
        try:
            self._step(key, rows, head_rows)
        finally:
            self.live = None

    def _step(self, key: StepKey, rows: int, head_rows: torch.Tensor | None) -> None:
        cfg, b, lay = self.cfg, self.buffers, self.kv.layout
        sc = step_context(rows, b.slots, b.positions, self.rope, lay.window, lay.ring, self.kv.page_table,
                          lay.page_tokens, self.ratios, key.context)  # fmt: skip
        if self.staging is not None and self.engram:
            self.staging.start(rows)
        table = self.weights.native("embed.weight")
        hidden = (
            table[b.tokens[:rows]] if self.tp is None else self.tp.embed(table, b.tokens[:rows])
        ).float()
        streams = hidden.unsqueeze(-2).expand(-1, cfg.hc_mult, -1).contiguous()
        pre = first_pre((rows,), cfg.hc_mult, torch.float32, hidden.device)
        for layer in range(cfg.num_hidden_layers):
            streams, pre = self._block(layer, streams, pre, sc, key.rows)
        if self.staging is not None and self.engram:
            self.staging.join()
        out = collapse_norm(streams, pre, self.weights.native("norm.weight"), cfg.rms_norm_eps)
        if head_rows is None:
            b.logits[:rows].copy_(self.head(out))
        else:  # HEAD_ROWS at a time: a row's logits do not depend on how many rows a step reads
            self.live = None  # rows gathered from the step's, every one wanted
            for lo in range(0, head_rows.numel(), HEAD_ROWS):
                at = head_rows[lo : lo + HEAD_ROWS]
                b.logits[at] = self.head(out[at])

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """The logits of rows x [R, D], fp32 [R, V] (a rank's vocabulary share gathered from every rank)."""
        return self.lin(x, "head") if self.tp is None else self.tp.head(x, self.weights.linear("head"))

    def _block(self, layer: int, streams: torch.Tensor, pre: torch.Tensor, sc, live: int):
        cfg, b = self.cfg, f"layers.{layer}"
        mode = cfg.layer_mode(layer)
        if mode.engram and self.engram:
            k = cfg.engram_layer_ids.index(layer)
            streams = engram(self, layer, k, streams, self.buffers.engram[: sc.rows, k])
        if layer in self.capture:
            d, k = cfg.hidden_size, self.capture.index(layer)
            stream_tap(streams, self.buffers.hidden[: sc.rows, k * d : (k + 1) * d])
        attend, ffn = (lambda x: attention(self, layer, mode, x, sc)), (lambda x: moe(self, layer, x, live))
        streams, pre = mhc_sites(self, b, streams, pre, attend, ffn)
        if self.trace is not None:
            self.trace.append(streams.clone())
        return streams, pre


def mhc_sites(f, block: str, streams: torch.Tensor, pre: torch.Tensor, attend: Callable[[torch.Tensor], torch.Tensor],
              ffn: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(streams, the FFN site's pre) after a block's two mixed sites (runtime/models/dsv41/reference/block.py in fp32):
    `attend(x)` is its attention, `ffn(x)` its MoE; shared by the backbone and the DSpark blocks (dspark.py)."""
    cfg, w, eps = f.cfg, f.weights, f.cfg.rms_norm_eps
    mix = {"norm_eps": eps, "hc_eps": cfg.hc_eps, "iters": cfg.hc_sinkhorn_iters,
           "post_alpha": cfg.hc_post_alpha}  # fmt: skip
    a_pre, a_post, a_comb = hc_mix(streams, w.native(f"{block}.hc_attn_fn"), w.native(f"{block}.hc_attn_scale"),
                                   w.native(f"{block}.hc_attn_base"), **mix)  # fmt: skip
    x = collapse_norm(streams, pre, w.native(f"{block}.attn_norm.weight"), eps)
    streams = hc_expand(attend(x), streams, a_post, a_comb)
    f_pre, f_post, f_comb = hc_mix(streams, w.native(f"{block}.hc_ffn_fn"), w.native(f"{block}.hc_ffn_scale"),
                                   w.native(f"{block}.hc_ffn_base"), **mix)  # fmt: skip
    x = collapse_norm(streams, a_pre, w.native(f"{block}.ffn_norm.weight"), eps)
    return hc_expand(ffn(x), streams, f_post, f_comb), f_pre
