"""A rank's share of a DeepSeek-V4.1 TP=N image (heads, wo_a groups, vocabulary, Engram columns), and how shares meet.

Column-parallel results (the head's vocabulary, Engram rows) are all-gathered in rank order, so every
rank holds the whole result; row-parallel partial sums are fixed-point words summed by an all-reduce
(runtime/models/dsv41/reference/numerics.py); the embedding is looked up on the rank owning each id and gathered.
A world of one (`Shard()`) runs the same code with no exchange.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any

import torch
from tfc.packs.deepseek_v41_contract import SEG_SHARDS
from tfc.runtime.models.dsv41.reference.numerics import BLOCK, from_fixed
from tfc.runtime.parallel.comm import SOLO

from tfc.errors import TfcError

_WO_A = re.compile(r"^layers\.0\.attn\.wo_a\.slice\.(\d+)\.trellis$")

Span = tuple[int, int]


class ShardError(TfcError):
    """A rank image whose splits do not fit its model or its world."""


@dataclass(frozen=True)
class Shard:
    """This rank of `world`: its heads and wo_a groups, every rank's vocabulary rows and Engram columns."""

    world: int = 1
    rank: int = 0
    heads: Span | None = None  # None: all
    groups: tuple[int, ...] | None = None  # None: all
    vocab: tuple[Span, ...] = ()  # every rank's [start, stop), rank order; () at TP=1
    engram_cols: tuple[Span, ...] = ()
    comm: Any = SOLO

    def local_groups(self, o_groups: int) -> tuple[int, ...]:
        """The wo_a groups (and so the heads, group by group) this rank computes."""
        return tuple(range(o_groups)) if self.groups is None else self.groups

    def reduce(self, acc: torch.Tensor) -> torch.Tensor:
        """The float64 value of every rank's fixed-point partial sums [2, ...] added together."""
        return from_fixed(self.comm.all_reduce(acc))

    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Rows of the (vocabulary-split) embedding for ids: each looked up where it lives, then gathered."""
        if self.world == 1:
            return table[ids]
        lo, hi = self.vocab[self.rank]
        mine = (ids >= lo) & (ids < hi)
        local = torch.zeros(ids.numel(), table.shape[1], dtype=table.dtype, device=table.device)
        local[mine] = table[ids[mine] - lo]
        everyone = torch.stack(self.comm.all_gather(local))
        starts = torch.tensor([s for s, _ in self.vocab[1:]], device=ids.device)
        owner = torch.bucketize(ids, starts, right=True)
        return everyone[owner, torch.arange(ids.numel(), device=ids.device)]

    def gather_last(self, t: torch.Tensor, spans: tuple[Span, ...]) -> torch.Tensor:
        """Every rank's part of the last dimension (rank r holds spans[r]) joined in rank order."""
        if self.world == 1:
            return t
        widest = max(b - a for a, b in spans)
        pad = torch.zeros(*t.shape[:-1], widest, dtype=t.dtype, device=t.device)
        pad[..., : t.shape[-1]] = t
        parts = self.comm.all_gather(pad)
        return torch.cat([p[..., : b - a] for p, (a, b) in zip(parts, spans, strict=True)], dim=-1)


def shard_of(manifest: Any, cfg: Any, weights: Any, comm: Any, device: torch.device | str) -> Shard:
    """This rank's shard, read from its image (plan attrs, segment shapes) and agreed with the other ranks."""
    world, rank = manifest.world, manifest.rank
    if world == 1:
        return Shard()
    where = f"rank {rank} of {world}"
    if comm.world == 1:
        raise ShardError(
            f"{where}: a TP={world} image runs as {world} ranks (tfc serve, generate and load start them)"
        )
    if (comm.world, comm.rank) != (world, rank):
        raise ShardError(
            f"{where}: the image is for rank {rank} of {world}, the process is rank {comm.rank} of {comm.world}"
        )
    groups = tuple(sorted(int(m[1]) for n in manifest.segment_map if (m := _WO_A.match(n))))
    per = cfg.num_attention_heads // cfg.o_groups
    heads = (groups[0] * per, (groups[-1] + 1) * per) if groups else (0, 0)
    sink = manifest.segment_map.get("layers.0.attn.attn_sink")
    if (
        not groups
        or groups != tuple(range(groups[0], groups[-1] + 1))
        or sink is None
        or tuple(sink.shape) != (heads[1] - heads[0],)
    ):
        raise ShardError(
            f"{where}: its wo_a groups {list(groups)} and attention sinks do not make whole heads"
        )
    if cfg.o_lora_rank % BLOCK or (heads[0] * cfg.head_dim) % BLOCK:
        raise ShardError(f"{where}: its wo_b rows and wq_b columns do not start on {BLOCK}-value blocks")
    part = (manifest.plan or {}).get("attrs", {}).get("head.trellis", {}).get("part")
    if not isinstance(part, list) or len(part) != 2:
        raise ShardError(f"{where}: the plan records no vocabulary part for the head")
    vocab = tuple(
        tuple(int(v) for v in p.tolist()) for p in comm.all_gather(torch.tensor(part, device=device))
    )
    cols: tuple[Span, ...] = ()
    if SEG_SHARDS in manifest.segment_map:
        cols = tuple((int(a), int(b)) for a, b in weights.array(SEG_SHARDS).tolist())
    if (
        vocab[0][0] != 0
        or vocab[-1][1] != cfg.vocab_size
        or any(a[1] != b[0] for a, b in itertools.pairwise(vocab))
    ):
        raise ShardError(
            f"{where}: the ranks' vocabulary parts {list(vocab)} do not cover {cfg.vocab_size} ids"
        )
    return Shard(world, rank, heads, groups, vocab, cols, comm)
