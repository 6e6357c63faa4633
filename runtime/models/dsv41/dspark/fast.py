"""The DSpark drafter on the arena: the reference drafter's maths (runtime/models/dsv41/dspark/drafter.py) in fp32.

Its blocks' EXL3 groups go through the fast forward's EXL3 products, their experts through the MoE kernel on
the image's `mtp.*` expert tables, natives are read as stored; nothing is decoded to dense. Per block j the
context keys of committed positions are FP8(rope(kv_norm_j(main_x @ wkv_j))) unpacked from the window-row
format (kv_rows.py: what the reference's FP8 quantiser gives, bit for bit) into each sequence's ring; a draft
block is the fast forward's mHC block (forward.py `mhc_sites`) with an attention of every draft row over the
ring's last min(window, P) keys and the block's own keys and the block's MoE (its own top-k). Same interface as
`DsparkDrafter` (`observe`, `draft`, `draft_many`, `DraftState`), so `DsparkSlots` runs either. Many sequences
draft together: their new rows are observed in shared 16-row pieces, and the blocks and head of up to 16
sequences run as one step of the runner's GraphCache over fixed shapes (each sequence's whole ring, the keys
before its context's start masked; 1, 2, 4, 8 or 16 sequences) from static inputs (anchors, positions, rings
copied in) into static outputs: on a GPU with graphs on, captured at the first draft of that size and replayed
after. The Markov walk then picks draft i of every sequence from one product and one call of the sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import torch
from tfc.runtime.graphs.graph_cache import GraphCache
from tfc.runtime.models.dsv41.dspark.drafter import (
    ChooseRows,
    Draft,
    DraftError,
    DraftInput,
    DsparkBase,
    as_rows,
    check_config,
    greedy,
    greedy_rows,
)
from tfc.runtime.models.dsv41.dspark.state import DraftState
from tfc.runtime.models.dsv41.fast.attention import attend, rope_heads, window_rows, wo_a
from tfc.runtime.models.dsv41.fast.forward import FastForward, mhc_sites
from tfc.runtime.models.dsv41.fast.fp32 import first_pre, hc_collapse, rms_norm
from tfc.runtime.models.dsv41.fast.graph_keys import CHUNK_ROWS
from tfc.runtime.models.dsv41.fast.kv.rows import unpack_fp8
from tfc.runtime.models.dsv41.fast.moe import block_moe
from tfc.runtime.models.dsv41.fast.rope import RopeTables, apply_rope
from tfc.runtime.models.dsv41.reference.state import WindowRing

DRAFT_SEQUENCES = 16  # the most sequences one replay of the blocks drafts (replays hold 1, 2, 4, 8 or 16)


@dataclass
class DraftBatch:
    """The static buffers of a replay of the blocks for `size` sequences."""

    size: int
    rings: torch.Tensor  # [size, blocks, window, head_dim] each sequence's rings, copied in
    scalars: torch.Tensor  # [size, 3] each sequence's anchor, P and its context's first position
    x: torch.Tensor  # [size * B, D] out: the collapsed draft rows
    base: torch.Tensor  # [size * B, V] out: the base logits


class FastDsparkDrafter(DsparkBase):
    """The DSpark blocks (`mtp.*`) of a fast forward's image, through its ops on the arena's views."""

    def __init__(self, forward: FastForward, graphs: GraphCache | None = None) -> None:
        cfg = forward.cfg
        check_config(cfg)
        self.f = forward
        w = forward.weights
        super().__init__(
            cfg,
            lambda name: w.has(name) or w.has(f"{name}.trellis"),
            lambda what: DraftError(f"the image has no {what}"),
        )
        self._held: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        for block in self.blocks:  # every tensor a draft reads, checked now rather than at the first draft
            forward.weights.experts(block)
            for name in ("wq_a", "wq_b", "wkv", "wo_b", *(f"wo_a.slice.{g}" for g in range(cfg.o_groups))):
                forward.weights.linear(f"{block}.attn.{name}")
        forward.weights.linear(self._names["main_proj"])
        # Rope rows past the slot's last position: a draft block's, and a padded piece of observed rows.
        past = max(CHUNK_ROWS, self.block_size)
        self.rope = RopeTables(cfg, forward.rope.positions + past, forward.kv.device)
        dev, n, window = forward.kv.device, self.block_size, cfg.sliding_window
        self._noise = torch.full((n,), cfg.dspark_noise_token_id, dtype=torch.long, device=dev)
        self._rows = torch.arange(n, device=dev)  # a draft block's rows
        self._slots = torch.arange(window, device=dev) - window  # the ring's slots before P, oldest first
        self._graphs = graphs
        self._batches: dict[int, DraftBatch] = {}  # by size, made at its first draft

    def observe(self, state: DraftState, target_hidden: torch.Tensor) -> None:
        """Write the context keys of committed positions state.position .. +n-1 (target hidden [n, T * D])."""
        self.observe_many([(state, target_hidden)])

    def observe_many(self, pairs: Sequence[tuple[DraftState, torch.Tensor]]) -> None:
        """Observe every (state, target hidden [n, T * D]) pair: their rows together, in 16-row pieces."""
        cfg, f, dev = self.config, self.f, self.f.kv.device
        rows, positions, runs = [], [], []  # runs: (state, first position, rows it keeps)
        for state, target_hidden in pairs:
            hidden = self._hidden(target_hidden, dev, torch.float32)
            for j in range(len(self.blocks)):
                if j not in state.windows:
                    state.windows[j] = WindowRing(cfg.sliding_window, cfg.head_dim, torch.float32, dev)
            keep = min(hidden.shape[0], cfg.sliding_window)  # only the last window reach the rings
            first = state.position + hidden.shape[0] - keep
            state.position += hidden.shape[0]
            if keep:
                rows.append(hidden[hidden.shape[0] - keep :])
                positions.append(first + torch.arange(keep, device=dev))
                runs.append((state, first, keep))
        if not runs:
            return
        rows, positions = torch.cat(rows), torch.cat(positions)
        norm = f.weights.native(self._names["main_norm.weight"])
        keys = []
        # 16-row pieces (the products' limit), padded: one shape
        for lo in range(0, rows.shape[0], CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows.shape[0] - lo)
            piece = torch.zeros(CHUNK_ROWS, rows.shape[1], device=rows.device)
            piece[:n] = rows[lo : lo + n]
            at = torch.zeros(CHUNK_ROWS, dtype=torch.long, device=rows.device)
            at[:n] = positions[lo : lo + n]
            main_x = rms_norm(f.lin(piece, self._names["main_proj"]), norm, cfg.rms_norm_eps)
            cos, sin = self.rope.rows("main", at)
            keys.append(torch.stack([self._keys(main_x, block, cos, sin)[:n] for block in self.blocks]))
        keys, lo = torch.cat(keys, dim=1), 0  # [blocks, rows, head_dim]
        for state, first, keep in runs:
            for j in range(len(self.blocks)):
                state.windows[j].write(first, keys[j, lo : lo + keep])
            lo += keep

    def draft(self, state: DraftState, target_hidden: torch.Tensor, last_token: int, k: int | None = None,
              choose: Callable[[torch.Tensor], int] = greedy) -> Draft:  # fmt: skip
        """Observe the newly committed positions, then draft k (default block size) tokens after `last_token`."""
        return self.draft_many([DraftInput(state, target_hidden, last_token, k)], as_rows(choose))[0]

    def draft_many(self, inputs: Sequence[DraftInput], choose: ChooseRows = greedy_rows) -> list[Draft]:
        """Every input's draft: their new rows observed together, then up to DRAFT_SEQUENCES sequences a replay of
        the blocks and one Markov walk for them all."""
        ks = [self._check(last, k) for _, _, last, k in inputs]
        self.observe_many([(state, hidden) for state, hidden, _, _ in inputs])
        for state, *_ in inputs:
            self._observed(state)
        out = []
        for lo in range(0, len(inputs), DRAFT_SEQUENCES):
            which = range(lo, min(lo + DRAFT_SEQUENCES, len(inputs)))
            batch = self._load([inputs[s] for s in which])
            if self._graphs is None:
                self._step(batch)
            else:
                buffers = (batch.rings, batch.scalars, batch.x, batch.base)
                self._graphs.run(self.graph_key(batch.size), partial(self._step, batch), buffers=buffers)
            out += self._walk(
                batch, [inputs[s].last_token for s in which], [ks[s] for s in which], choose, which
            )
        return out

    def graph_key(self, sequences: int) -> tuple:
        """The GraphCache key of a replay of the blocks for `sequences` (a power of two)."""
        return ("dspark", sequences, *self.blocks)

    def _load(self, inputs: Sequence[DraftInput]) -> DraftBatch:
        """The static inputs of a replay for these sequences (its buffers padded to a power of two): each anchor,
        P = its position, its context's first position, its rings; padding sequences see no context."""
        size = 1 << (len(inputs) - 1).bit_length()
        batch = self._batches.get(size)
        if batch is None:
            cfg, dev, n = self.config, self.f.kv.device, self.block_size
            batch = self._batches[size] = DraftBatch(
                size,
                torch.zeros(size, len(self.blocks), cfg.sliding_window, cfg.head_dim, device=dev),
                torch.zeros(size, 3, dtype=torch.long, device=dev),
                torch.zeros(size * n, cfg.hidden_size, device=dev),
                torch.zeros(size * n, cfg.vocab_size, device=dev),
            )
        scalars = [[last, state.position, state.start] for state, _, last, _ in inputs]
        scalars += [[0, 0, 0]] * (size - len(inputs))
        for s, (state, *_) in enumerate(inputs):
            torch.stack([state.windows[j].keys for j in range(len(self.blocks))], out=batch.rings[s])
        batch.scalars.copy_(torch.tensor(scalars))
        return batch

    def _step(self, batch: DraftBatch) -> None:
        """The draft's blocks and head on a batch's loaded inputs, into its static x and base (the graphed step)."""
        x, base = self._blocks(batch)
        batch.x.copy_(x)
        batch.base.copy_(base)

    def _blocks(self, batch: DraftBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Every sequence's draft rows through every block and the head: (x [S * B, D] collapsed, the base logits
        [S * B, V])."""
        cfg, f, n = self.config, self.f, self.block_size
        dev, rows = f.kv.device, batch.size * n
        anchor, at, first = (v.unsqueeze(1) for v in batch.scalars.unbind(1))
        ids = torch.where(self._rows == 0, anchor, self._noise).reshape(-1)
        positions = (at + self._rows).reshape(-1)
        seen = at + self._slots  # each ring's positions before P, oldest first; those before `first` masked
        read, valid = seen % cfg.sliding_window, seen >= first
        streams = f.weights.native("embed.weight")[ids].float().unsqueeze(-2).expand(-1, cfg.hc_mult, -1)
        streams, pre = streams.contiguous(), first_pre((rows,), cfg.hc_mult, torch.float32, dev)
        for j, block in enumerate(self.blocks):
            ctx = batch.rings[:, j].gather(1, read.unsqueeze(-1).expand(-1, -1, cfg.head_dim))
            attend_block = partial(self._attention, j, positions=positions, ctx=ctx, ctx_valid=valid)
            ffn = partial(block_moe, f, block, live=rows, top_k=cfg.dspark_num_experts_per_tok)
            streams, pre = mhc_sites(f, block, streams, pre, attend_block, ffn)
        x = hc_collapse(streams, pre)
        norm = f.weights.native(self._names["norm.weight"])
        return x, f.lin(rms_norm(x, norm, cfg.rms_norm_eps), "head")

    def _walk(self, batch: DraftBatch, last: list[int], ks: list[int], choose: ChooseRows,
              which: Sequence[int]) -> list[Draft]:  # fmt: skip
        """The Markov walk of a batch's sequences: draft i of all of them from one product, picked by one call
        of `choose`. The products always run DRAFT_SEQUENCES rows, so a row's bits never depend on the others."""
        embed, head, proj = self._heads()
        count, n, dev = len(last), self.block_size, embed.device
        x = batch.x.view(batch.size, n, -1)
        base = batch.base.view(batch.size, n, -1)
        tokens = torch.zeros(DRAFT_SEQUENCES, dtype=torch.long, device=dev)
        tokens[:count] = torch.tensor(last, device=dev)
        picked, logits, confidence = [], [], []
        for i in range(max(ks)):
            prev = embed[tokens]  # [DRAFT_SEQUENCES, r]
            logits.append(base[:count, i] + (prev @ head.T)[:count])
            if proj is not None:
                rows = torch.zeros(DRAFT_SEQUENCES, x.shape[2], device=dev)
                rows[:count] = x[:count, i]
                confidence.append((torch.cat((rows, prev), 1) @ proj)[:count])
            tokens[:count] = torch.as_tensor(choose(i, logits[-1], which), device=dev)
            picked.append(tokens[:count].clone())
        picked = torch.stack(picked, 1).tolist()
        return [
            Draft(tuple(picked[s][:k]), torch.stack([step[s] for step in logits[:k]]), base[s].clone(),
                  torch.stack([step[s] for step in confidence[:k]]) if confidence else None)
            for s, k in enumerate(ks)
        ]  # fmt: skip

    def _heads(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """The Markov embedding [V, r] and head [V, r] and the confidence projection [D + r] in fp32 (made once)."""
        if self._held is None:
            w = self.f.weights
            proj = None if self._confidence is None else w.native(self._confidence).float().reshape(-1)
            self._held = (w.native(self._names["markov_head.embed.weight"]).float(),
                          w.native(self._names["markov_head.head.weight"]).float(), proj)  # fmt: skip
        return self._held

    def _keys(self, x: torch.Tensor, block: str, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """FP8 K=V latents [n, head_dim] of rows x, as a swa layer's window rows read back."""
        f, p = self.f, f"{block}.attn"
        rows = window_rows(f.lin(x, f"{p}.wkv"), f.weights.native(f"{p}.kv_norm.weight"),
                           self.config.rms_norm_eps, cos, sin)  # fmt: skip
        return unpack_fp8(rows, self.config.head_dim)

    def _attention(self, j: int, x: torch.Tensor, positions: torch.Tensor, ctx: torch.Tensor,
                   ctx_valid: torch.Tensor) -> torch.Tensor:  # fmt: skip
        """Block j's attention of the draft rows x [S * B, D] of S sequences, each row over its sequence's context
        keys ctx [S, window, head_dim] (those ctx_valid [S, window]) and its sequence's own rows' keys."""
        cfg, f, p = self.config, self.f, f"{self.blocks[j]}.attn"
        rows, heads, eps = x.shape[0], cfg.num_attention_heads, cfg.rms_norm_eps
        sequences, n = ctx.shape[0], self.block_size
        cos, sin = self.rope.rows("main", positions)
        q_res = rms_norm(f.lin(x, f"{p}.wq_a"), f.weights.native(f"{p}.q_norm.weight"), eps)
        q = rope_heads(f.lin(q_res, f"{p}.wq_b"), heads, cos, sin)
        own = self._keys(x, self.blocks[j], cos, sin).view(sequences, n, -1)
        keys = torch.cat((ctx, own), 1).unsqueeze(1).expand(-1, n, -1, -1).reshape(rows, -1, cfg.head_dim)
        mine = torch.ones(sequences, n, dtype=torch.bool, device=x.device)
        valid = torch.cat((ctx_valid, mine), 1).unsqueeze(1).expand(-1, n, -1).reshape(rows, -1)
        out = attend(q, keys, valid, f.weights.native(f"{p}.attn_sink"))
        out = apply_rope(out, cos.unsqueeze(1), sin.unsqueeze(1), inverse=True)
        mixed = wo_a(f, p, out.reshape(rows, -1), tuple(range(cfg.o_groups)))
        return f.lin(mixed, f"{p}.wo_b")


def fast_dspark_slots(forward: FastForward, graphs: GraphCache | None = None):
    """The fast DSpark drafter over every slot (DsparkSlots; its blocks a step of `graphs`), or None and why not."""
    from tfc.runtime.models.dsv41.dspark.drafting import DsparkSlots
    from tfc.runtime.models.dsv41.fast.weights import FastWeightError

    try:
        return DsparkSlots(FastDsparkDrafter(forward, graphs)), ""
    except (DraftError, FastWeightError) as error:
        return None, str(error).splitlines()[0]
