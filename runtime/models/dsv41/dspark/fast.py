"""The DSpark drafter on the arena: the reference drafter's maths (runtime/models/dsv41/dspark/drafter.py) in fp32.

Its blocks' EXL3 groups go through the fast forward's EXL3 products, their experts through the MoE kernel on
the image's `mtp.*` expert tables, natives are read as stored; nothing is decoded to dense. Per block j the
context keys of committed positions are FP8(rope(kv_norm_j(main_x @ wkv_j))) unpacked from the window-row
format (kv_rows.py: what the reference's FP8 quantiser gives, bit for bit) into each sequence's ring; a draft
block is the fast forward's mHC block (forward.py `mhc_sites`) with an attention of every draft row over the
ring's last min(window, P) keys and the block's own keys and the block's MoE (its own top-k). Same interface as
`DsparkDrafter` (`observe`, `draft`, `DraftState`), so `DsparkSlots` runs either. One sequence at a time. A
draft's blocks and head run over fixed shapes (the whole ring, the keys before the context's start masked) from
static inputs (the anchor, the positions and the sequence's rings copied in) into static outputs, as one step of
the runner's GraphCache: on a GPU with graphs on, captured at the first draft and replayed after, like a decode
step. The Markov walk that picks each draft stays on the host (the sampler's choice).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from tfc.runtime.graphs.graph_cache import GraphCache
from tfc.runtime.models.dsv41.dspark.drafter import Draft, DraftError, DsparkBase, check_config, greedy
from tfc.runtime.models.dsv41.dspark.state import DraftState
from tfc.runtime.models.dsv41.fast.attention import attend, rope_heads, window_rows, wo_a
from tfc.runtime.models.dsv41.fast.forward import FastForward, mhc_sites
from tfc.runtime.models.dsv41.fast.fp32 import first_pre, hc_collapse, rms_norm
from tfc.runtime.models.dsv41.fast.graph_keys import CHUNK_ROWS
from tfc.runtime.models.dsv41.fast.kv.rows import unpack_fp8
from tfc.runtime.models.dsv41.fast.moe import block_moe
from tfc.runtime.models.dsv41.fast.rope import RopeTables, apply_rope
from tfc.runtime.models.dsv41.reference.state import WindowRing


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
        self._scalars = torch.zeros(3, dtype=torch.long, device=dev)  # the anchor, P, the context's start
        self._graphs = graphs
        # The step's static buffers, made at the first draft: the rings [blocks, window, head_dim] copied in,
        # x [B, D] and the base logits [B, V] out.
        self._rings = self._x = self._base = None

    @property
    def graph_key(self) -> tuple[str, ...]:
        """The GraphCache key of a draft's blocks."""
        return ("dspark", *self.blocks)

    def observe(self, state: DraftState, target_hidden: torch.Tensor) -> None:
        """Write the context keys of committed positions state.position .. +n-1 (target hidden [n, T * D])."""
        cfg, f = self.config, self.f
        hidden = self._hidden(target_hidden, f.kv.device, torch.float32)
        if hidden.shape[0] == 0:
            return
        for j in range(len(self.blocks)):
            if j not in state.windows:
                state.windows[j] = WindowRing(cfg.sliding_window, cfg.head_dim, torch.float32, f.kv.device)
        keep = min(hidden.shape[0], cfg.sliding_window)  # only the last window reach the rings
        first = state.position + hidden.shape[0] - keep
        norm = f.weights.native(self._names["main_norm.weight"])
        for lo in range(0, keep, CHUNK_ROWS):  # 16-row pieces (the products' limit), padded: one shape each
            n = min(CHUNK_ROWS, keep - lo)
            rows = torch.zeros(CHUNK_ROWS, hidden.shape[1], device=hidden.device)
            rows[:n] = hidden[hidden.shape[0] - keep + lo :][:n]
            main_x = rms_norm(f.lin(rows, self._names["main_proj"]), norm, cfg.rms_norm_eps)
            cos, sin = self.rope.rows("main", first + lo + torch.arange(CHUNK_ROWS, device=hidden.device))
            for j, block in enumerate(self.blocks):
                state.windows[j].write(first + lo, self._keys(main_x, block, cos, sin)[:n])
        state.position += hidden.shape[0]

    def draft(self, state: DraftState, target_hidden: torch.Tensor, last_token: int, k: int | None = None,
              choose: Callable[[torch.Tensor], int] = greedy) -> Draft:  # fmt: skip
        """Observe the newly committed positions, then draft k (default block size) tokens after `last_token`."""
        k = self._begin(state, target_hidden, last_token, k)
        self._load(state, last_token)
        if self._graphs is None:
            self._step()
        else:
            buffers = (self._rings, self._scalars, self._x, self._base)
            self._graphs.run(self.graph_key, self._step, buffers=buffers)
        x, base = self._x, self._base
        embed, head, proj = self._heads()
        tokens, logits, confidence = [int(last_token)], [], []
        for i in range(k):
            prev = embed[tokens[-1]]
            logits.append(base[i] + head @ prev)
            if proj is not None:
                confidence.append(torch.dot(torch.cat((x[i], prev)), proj))
            tokens.append(int(choose(logits[-1])))
        conf = torch.stack(confidence) if confidence else None
        return Draft(tuple(tokens[1:]), torch.stack(logits), base.clone(), conf)

    def _load(self, state: DraftState, last_token: int) -> None:
        """The static inputs of a draft: the anchor, P = the sequence's position, its context's first position and
        its rings."""
        rings = [state.windows[j].keys for j in range(len(self.blocks))]
        if self._rings is None or self._rings.shape[0] != len(rings):
            cfg, dev = self.config, rings[0].device
            self._rings = torch.zeros((len(rings), *rings[0].shape), device=dev)
            self._x = torch.zeros(self.block_size, cfg.hidden_size, device=dev)
            self._base = torch.zeros(self.block_size, cfg.vocab_size, device=dev)
        torch.stack(rings, out=self._rings)
        self._scalars.copy_(torch.tensor([last_token, state.position, state.start]))

    def _step(self) -> None:
        """The draft's blocks and head on the loaded inputs, into the static x and base (the graphed step)."""
        x, base = self._blocks()
        self._x.copy_(x)
        self._base.copy_(base)

    def _blocks(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The draft rows through every block and the head: (x [B, D] collapsed, the base logits [B, V])."""
        cfg, f, n = self.config, self.f, self.block_size
        dev, anchor, at, first = f.kv.device, self._scalars[0], self._scalars[1], self._scalars[2]
        ids = torch.where(self._rows == 0, anchor, self._noise)
        positions = at + self._rows
        seen = at + self._slots  # the ring's positions before P, oldest first; those before `first` masked
        read, valid = seen % cfg.sliding_window, seen >= first
        streams = f.weights.native("embed.weight")[ids].float().unsqueeze(-2).expand(-1, cfg.hc_mult, -1)
        streams, pre = streams.contiguous(), first_pre((n,), cfg.hc_mult, torch.float32, dev)
        for j, block in enumerate(self.blocks):
            ctx = self._rings[j][read]
            attend_block = partial(self._attention, j, positions=positions, ctx=ctx, ctx_valid=valid)
            ffn = partial(block_moe, f, block, live=n, top_k=cfg.dspark_num_experts_per_tok)
            streams, pre = mhc_sites(f, block, streams, pre, attend_block, ffn)
        x = hc_collapse(streams, pre)
        norm = f.weights.native(self._names["norm.weight"])
        return x, f.lin(rms_norm(x, norm, cfg.rms_norm_eps), "head")

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
        """Block j's attention of the draft rows x [B, D] over its context keys ctx [window, head_dim] (those
        ctx_valid) and their own."""
        cfg, f, p = self.config, self.f, f"{self.blocks[j]}.attn"
        rows, heads, eps = x.shape[0], cfg.num_attention_heads, cfg.rms_norm_eps
        cos, sin = self.rope.rows("main", positions)
        q_res = rms_norm(f.lin(x, f"{p}.wq_a"), f.weights.native(f"{p}.q_norm.weight"), eps)
        q = rope_heads(f.lin(q_res, f"{p}.wq_b"), heads, cos, sin)
        keys = torch.cat((ctx, self._keys(x, self.blocks[j], cos, sin))).unsqueeze(0).expand(rows, -1, -1)
        own = torch.ones(rows, dtype=torch.bool, device=x.device)
        valid = torch.cat((ctx_valid, own)).unsqueeze(0).expand(rows, -1)
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
