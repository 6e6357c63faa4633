"""The DeepSeek-V4.1 DSpark drafter over the reference model's weights: target hidden states in, a draft block out.

Reference: deepseek-ai/DeepSeek-V4.1-Flash inference/model.py (revision dba1be0a: `Transformer.forward`'s
`main_hiddens`, `forward_spec`, `DSparkBlock.forward_embed` / `forward_head`, `DSparkAttention`,
`get_dspark_topk_idxs`, `DSparkMarkovHead`, `DSparkConfidenceHead`), as read through public ports; sources and
the choices made where they differ are in docs/drafting.md. With h_p = concat over the target layers l of the
mean of the hc streams entering block l at committed position p (Dsv41Model.forward's `capture`):

    main_x_p  = main_norm(h_p @ main_proj)                        shared by the three blocks
    ring_j[p] = FP8(rope(kv_norm_j(main_x_p @ wkv_j), p))           per DSpark block j, main rope, p % window
    a block at positions P .. P+B-1 (P = committed positions): tokens [anchor, noise x (B-1)], streams =
    the backbone embedding on every hc stream, pre one-hot; then each block j = mtp.j as a backbone mHC block
    (routed experts dspark_n_routed_experts, top dspark_num_experts_per_tok) whose attention takes q and kv
    from the block's rows and attends, from every row, to ring_j's last min(window, P) keys and all B
    block keys (no causal mask inside the block; the block's keys are never stored)
    x = collapse(streams, the last block's FFN-site pre);  U = norm(x) @ head                       [B, V]
    t_0 = anchor;  logits_i = U_i + markov.head @ markov.embed[t_i];  t_{i+1} = choose(logits_i)
    confidence_i = proj . [x_i ; markov.embed[t_i]]               a logit (the reference applies no sigmoid)

The anchor is the token the target sampled from position P-1's logits, so draft i proposes position P+1+i.
Numerics as the backbone (runtime/models/dsv41/reference/numerics.py): float64 modules rounded to the model's dtype.
TP=1 only for now.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from tfc.runtime.models.dsv41.config import Dsv41Config
from tfc.runtime.models.dsv41.dspark.state import DraftState, context
from tfc.runtime.models.dsv41.reference.attention import attend
from tfc.runtime.models.dsv41.reference.block import mhc_block
from tfc.runtime.models.dsv41.reference.csa import rms_norm
from tfc.runtime.models.dsv41.reference.forward import Dsv41Model, MissingWeight
from tfc.runtime.models.dsv41.reference.mhc import first_pre, hc_collapse
from tfc.runtime.models.dsv41.reference.numerics import (
    WIDE,
    column_linear,
    fixed_sum,
    linear,
    row_partials,
    wide,
)
from tfc.runtime.models.dsv41.reference.quant import fake_quant_fp8
from tfc.runtime.models.dsv41.reference.rope import apply_rope
from tfc.runtime.models.dsv41.reference.state import WindowRing
from tfc.runtime.worker.runner import ChooseRows

from tfc.errors import TfcError

# Tensors stored once for the whole drafter, in the latest mtp.i holding them (spec section 3.2).
SUFFIXES = (
    "main_proj",
    "main_norm.weight",
    "norm.weight",
    "markov_head.embed.weight",
    "markov_head.head.weight",
)
CONFIDENCE = "confidence_head.proj.weight"


class DraftError(TfcError):
    """A drafter that cannot be built for this model, or a draft request it cannot serve."""


@dataclass(frozen=True)
class Draft:
    """One drafted block: the proposed tokens and the distributions they were chosen from."""

    tokens: tuple[int, ...]  # k draft tokens, for positions P+1 .. P+k
    logits: torch.Tensor  # [k, V] base + Markov bias along `tokens`: the draft distribution q before softmax
    base: torch.Tensor  # [B, V] the block's parallel logits U (no Markov bias)
    confidence: torch.Tensor | None  # [k] confidence logits, None when the model has no confidence head


def greedy(logits: torch.Tensor) -> int:
    """The highest logit's token (the lowest id among equals)."""
    return int(torch.argmax(logits))


def greedy_rows(i: int, logits: torch.Tensor, which: Sequence[int]) -> torch.Tensor:
    """The highest logit's token of every row (the lowest id among equals)."""
    return torch.argmax(logits, dim=1)


def chosen_among(choose: ChooseRows, index: Sequence[int]) -> ChooseRows:
    """`choose` over a subset of its asks: row r of a call's `which` is ask index[r]."""
    return lambda i, logits, which: choose(i, logits, [index[w] for w in which])


def as_rows(choose: Callable[[torch.Tensor], int]) -> ChooseRows:
    """A one-sequence chooser of a logits row [V] as a ChooseRows of that one sequence."""
    return lambda i, logits, which: [int(choose(logits[0]))]


def one_row(choose: ChooseRows, s: int) -> Callable[[torch.Tensor], int]:
    """`choose` as a one-sequence chooser of input s: each call picks the next draft from a logits row [V]."""
    index = itertools.count()
    return lambda row: int(choose(next(index), row.unsqueeze(0), [s])[0])


class DraftInput(NamedTuple):
    """One sequence's part of a draft: its state, its newly committed target rows, the token to follow, k."""

    state: DraftState
    hidden: torch.Tensor  # [n, T * D] target hidden rows of the positions committed since its last draft
    last_token: int
    k: int | None = None  # default: the block size


class DsparkBase:
    """What both DSpark drafters share: the drafter-wide tensor names, the state and the checks of their inputs."""

    def __init__(
        self, cfg: Dsv41Config, has: Callable[[str], bool], missing: Callable[[str], Exception]
    ) -> None:
        """Name the drafter-wide tensors: has(name) says whether a tensor is stored, missing(text) is the error."""
        self.config = cfg
        self.blocks = tuple(f"mtp.{j}" for j in range(cfg.num_nextn_predict_layers))
        self.block_size = cfg.dspark_block_size
        self.target_layers = cfg.dspark_target_layer_ids
        self._names = {s: self._stored(s, has, missing) for s in SUFFIXES}
        self._confidence = self._stored(CONFIDENCE, has, missing, optional=True)

    def _stored(
        self,
        suffix: str,
        has: Callable[[str], bool],
        missing: Callable[[str], Exception],
        optional: bool = False,
    ) -> str | None:
        """The name of a drafter-wide tensor: the latest mtp.i that holds it."""
        for block in reversed(self.blocks):
            name = f"{block}.{suffix}"
            if has(name):
                return name
        if optional:
            return None
        raise missing(f"DSpark tensor {suffix!r} in any of {', '.join(self.blocks)}")

    def new_state(self) -> DraftState:
        """An empty drafter state for one new sequence."""
        return DraftState()

    def _hidden(self, target_hidden: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The target hidden rows [n, T * D] on `device` in `dtype`, checked."""
        width = len(self.target_layers) * self.config.hidden_size
        hidden = torch.as_tensor(target_hidden).to(device, dtype)
        if hidden.dim() != 2 or hidden.shape[1] != width:
            raise DraftError(f"target hidden must be [n, {width}], got {tuple(hidden.shape)}")
        return hidden

    def _begin(self, state: DraftState, target_hidden: torch.Tensor, last_token: int, k: int | None) -> int:
        """Check a draft request, observe its newly committed positions and give its k (default block size)."""
        k = self._check(last_token, k)
        self.observe(state, target_hidden)
        self._observed(state)
        return k

    def _check(self, last_token: int, k: int | None) -> int:
        """A draft request's k (default block size), checked with its last token."""
        k, vocab = self.block_size if k is None else k, self.config.vocab_size
        if not 1 <= k <= self.block_size:
            raise DraftError(f"k = {k}: a DSpark block drafts 1 to {self.block_size} tokens")
        if not 0 <= last_token < vocab:
            raise DraftError(f"last token {last_token} is outside the vocabulary [0, {vocab})")
        return k

    def _observed(self, state: DraftState) -> None:
        """Raise DraftError where a state has observed no position to draft from."""
        if state.position == state.start:
            raise DraftError("nothing observed yet: a draft needs the target hidden of at least one position")

    def observe(self, state: DraftState, target_hidden: torch.Tensor) -> None:
        """Write the context keys of committed positions state.position .. +n-1 (target hidden [n, T * D])."""
        raise NotImplementedError

    def draft(self, state: DraftState, target_hidden: torch.Tensor, last_token: int, k: int | None = None,
              choose: Callable[[torch.Tensor], int] = greedy) -> Draft:  # fmt: skip
        """Observe the newly committed positions, then draft k (default block size) tokens after `last_token`."""
        raise NotImplementedError

    def draft_many(self, inputs: Sequence[DraftInput], choose: ChooseRows = greedy_rows) -> list[Draft]:
        """Every input's draft, one sequence at a time (the fast drafter runs them together)."""
        return [self.draft(state, hidden, last, k, one_row(choose, s))
                for s, (state, hidden, last, k) in enumerate(inputs)]  # fmt: skip


def check_config(cfg: Dsv41Config) -> None:
    """Raise DraftError unless the model config describes a DSpark drafter."""
    if cfg.num_nextn_predict_layers < 1 or cfg.dspark_block_size < 1 or not cfg.dspark_target_layer_ids:
        raise DraftError("the model config has no DSpark drafter (num_nextn_predict_layers, dspark_*)")
    if cfg.dspark_noise_token_id is None or not 0 <= cfg.dspark_noise_token_id < cfg.vocab_size:
        raise DraftError(f"dspark_noise_token_id {cfg.dspark_noise_token_id} is not a token id")


class DsparkDrafter(DsparkBase):
    """The three DSpark blocks (`mtp.*`) of a reference model, over its weights (`model.get`)."""

    def __init__(self, model: Dsv41Model) -> None:
        cfg = model.config
        check_config(cfg)
        if model.shard.world != 1:
            raise DraftError("the DSpark drafter runs at TP=1 only (this rank is one of a TP world)")
        self.model = model
        weights = model._weights
        super().__init__(
            cfg,
            lambda name: name in weights or f"{name}.weight" in weights,
            lambda what: MissingWeight(f"weights lack {what}"),
        )
        self._markov_t: torch.Tensor | None = None

    def observe(self, state: DraftState, target_hidden: torch.Tensor) -> None:
        """Write the context keys of committed positions state.position .. +n-1 (target hidden [n, T * D])."""
        cfg, get = self.config, self.model.get
        hidden = self._hidden(target_hidden, self.model.device, self.model.dtype)
        if hidden.shape[0] == 0:
            return
        eps, names = cfg.rms_norm_eps, self._names
        main_x = rms_norm(linear(hidden, get(names["main_proj"])), get(names["main_norm.weight"]), eps)
        main_x = main_x.to(WIDE)  # then as a swa layer's attn_norm output: widened for its kv
        positions = torch.arange(state.position, state.position + hidden.shape[0], device=hidden.device)
        cos, sin = (t.to(WIDE) for t in self.model.rope.cos_sin(positions, "main", self.model.dtype))
        for j, block in enumerate(self.blocks):
            ring = state.windows.get(j)
            if ring is None:
                ring = state.windows[j] = WindowRing(
                    cfg.sliding_window, cfg.head_dim, self.model.dtype, self.model.device
                )
            ring.write(state.position, _keys(main_x, get, f"{block}.attn", eps, cos, sin))
        state.position += hidden.shape[0]

    def draft(
        self,
        state: DraftState,
        target_hidden: torch.Tensor,
        last_token: int,
        k: int | None = None,
        choose: Callable[[torch.Tensor], int] = greedy,
    ) -> Draft:
        """Observe the newly committed positions, then draft k (default block size) tokens after `last_token`.

        `last_token` is the token the target chose from the last committed position's logits; `choose` picks
        each draft token from its logits row (greedy by default; a sampler may be passed)."""
        cfg, get = self.config, self.model.get
        k = self._begin(state, target_hidden, last_token, k)
        device, dtype = self.model.device, self.model.dtype
        start, n = state.position, self.block_size
        ids = torch.full((n,), cfg.dspark_noise_token_id, dtype=torch.long, device=device)
        ids[0] = last_token
        positions = torch.arange(start, start + n, device=device)
        streams = self.model.shard.embed(get("embed.weight"), ids).unsqueeze(-2).expand(-1, cfg.hc_mult, -1)
        streams, pre = streams.contiguous(), first_pre((n,), cfg.hc_mult, dtype, device)
        for j in range(len(self.blocks)):
            streams, pre = self._block(
                j, streams, pre, positions, context(state.windows[j], start, state.start)
            )
        x = hc_collapse(streams, pre)
        base = column_linear(rms_norm(x, get(self._names["norm.weight"]), cfg.rms_norm_eps), get("head"))
        tokens, logits, confidence = [int(last_token)], [], []
        embed = get(self._names["markov_head.embed.weight"])
        for i in range(k):
            prev = embed[tokens[-1]]
            logits.append(_biased(base[i], prev, self._markov()))
            if self._confidence is not None:
                confidence.append(_confidence(x[i], prev, get(self._confidence).reshape(-1)))
            tokens.append(int(choose(logits[-1])))
        conf = torch.stack(confidence) if confidence else None
        return Draft(tuple(tokens[1:]), torch.stack(logits), base, conf)

    def markov_bias(self, token: int) -> torch.Tensor:
        """The Markov head's logit bias [V] for the token before a draft position."""
        return _biased(None, self.model.get(self._names["markov_head.embed.weight"])[token], self._markov())

    def _markov(self) -> torch.Tensor:
        """markov_head.head transposed to [rank, V] (converted once)."""
        if self._markov_t is None:
            self._markov_t = self.model.get(self._names["markov_head.head.weight"]).T.contiguous()
        return self._markov_t

    def _block(
        self, j: int, streams: torch.Tensor, pre: torch.Tensor, positions: torch.Tensor, ctx: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """DSpark block j on the draft rows: the backbone's mHC block with the drafter's attention and MoE."""
        cfg = self.config
        return mhc_block(
            cfg, self.model.get, self.blocks[j], streams, pre, lambda x: self._attention(j, x, positions, ctx),
            cfg.dspark_n_routed_experts, cfg.dspark_num_experts_per_tok, self.model.shard.reduce,
        )  # fmt: skip

    def _attention(self, j: int, x: torch.Tensor, positions: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Block j's attention of the draft rows x [B, D] over its context keys ctx [c, head_dim] and their own."""
        cfg, get, p = self.config, self.model.get, f"{self.blocks[j]}.attn"
        hd, per = cfg.head_dim, cfg.num_attention_heads // cfg.o_groups
        act, x = x.dtype, x.to(WIDE)
        cos, sin = (t.to(WIDE) for t in self.model.rope.cos_sin(positions, "main", act))
        q_res = rms_norm(linear(x, get(f"{p}.wq_a")), get(f"{p}.q_norm.weight"), cfg.rms_norm_eps)
        cos_h, sin_h = cos.unsqueeze(-2), sin.unsqueeze(-2)  # per head
        q = apply_rope(column_linear(q_res, get(f"{p}.wq_b")).unflatten(-1, (-1, hd)), cos_h, sin_h)
        keys = torch.cat((ctx.to(WIDE), _keys(x, get, p, cfg.rms_norm_eps, cos, sin)))
        # attend's mask admits every key when all keys and queries share one position: no causal mask here.
        key_pos = torch.zeros(keys.shape[0], dtype=torch.long, device=x.device)
        q_pos = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
        sinks, out = get(f"{p}.attn_sink"), torch.empty_like(q)
        for g in range(cfg.o_groups):  # one wo_a group at a time, as the backbone
            h = slice(g * per, (g + 1) * per)
            out[:, h] = attend(q[:, h].contiguous(), keys, key_pos, q_pos, 1, sinks[h])
        out = apply_rope(out, cos_h, sin_h, inverse=True)
        mixed = [
            linear(out[:, g * per : (g + 1) * per].flatten(1), get(f"{p}.wo_a.slice.{g}"))
            for g in range(cfg.o_groups)
        ]
        partials = row_partials(torch.cat(mixed, dim=-1), get(f"{p}.wo_b"))
        return self.model.shard.reduce(fixed_sum(partials)).to(act)


def _keys(
    x: torch.Tensor,
    get: Callable[[str], torch.Tensor],
    prefix: str,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
) -> torch.Tensor:
    """K=V latents FP8(rope(kv_norm(x @ wkv))) of float64 rows x, as a swa layer computes them."""
    kv = rms_norm(linear(x, get(f"{prefix}.wkv")), get(f"{prefix}.kv_norm.weight"), eps)
    return fake_quant_fp8(apply_rope(kv, cos, sin), 32)


@wide
def _biased(base: torch.Tensor | None, prev: torch.Tensor, head_t: torch.Tensor) -> torch.Tensor:
    """base [V] + the Markov bias prev [rank] @ head_t [rank, V] (the bias alone without base)."""
    bias = column_linear(prev.unsqueeze(0), head_t)[0]
    return bias if base is None else base + bias


@wide
def _confidence(x: torch.Tensor, prev: torch.Tensor, proj: torch.Tensor) -> torch.Tensor:
    """The confidence logit proj . [x ; prev]."""
    return torch.dot(torch.cat((x, prev)), proj)
