"""A step's MoE pairs ordered by expert, and the groups of up to GROUP_PAIRS pairs of one expert that the MoE kernels
decode each expert tile once for.

Pair p = t * (topk + 1) + j (token t's j-th routed expert, j = topk the shared expert) goes to sorted position
s(p) = #{p' : e(p') < e(p), or e(p') = e(p) and p' < p}: ascending by table entry, stable. A group starts at every
position whose offset in its entry's run is a multiple of GROUP_PAIRS. One launch, device-only (a captured step
can hold it): each program counts for its own pairs, the last to finish lists the group leaders. Counting, not
atomics, places a pair, so the order never depends on timing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from tfc.kernels.exl3.launch import counters
from tfc.kernels.exl3.moe_tl import pair
from tfc.kernels.exl3.tl import release_fence

GROUP_PAIRS = 4  # pairs whose rows share one mma: 4 rows as fp16 high / low pairs fill its 8 columns
BLOCK = 64  # pairs a program of the ordering kernel takes


@triton.jit
def group_at(i, end_ptr, lead_ptr, nlead_ptr, GROUP: tl.constexpr, SORTED: tl.constexpr):
    """(whether group program i has a group, its first sorted position, its pairs); unsorted (one token: no two
    pairs share an entry), program i is pair i alone."""
    if SORTED:
        live = i < tl.load(nlead_ptr)
        s = tl.load(lead_ptr + i, mask=live, other=0)
        n = tl.minimum(tl.load(end_ptr + s, mask=live, other=0) - s, GROUP)
    else:
        live = i >= 0
        s = i
        n = tl.full((), 1, tl.int32)
    return live, s, n


@triton.jit
def pair_at(order_ptr, s, SORTED: tl.constexpr):
    """The pair at sorted position s (itself, unsorted)."""
    if SORTED:
        p = tl.load(order_ptr + s)
    else:
        p = s
    return p


@triton.jit
def _moe_order_kernel(ids_ptr, order_ptr, end_ptr, lead_ptr, nlead_ptr, cnt_ptr, P, topk, n_routed,
                      GROUP: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    """order[s] = the pair at sorted position s, end[s] = the end of its entry's run; the last program lists the
    group leaders' positions in lead[0 : nlead[0]], ascending."""
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    live = p < P
    e = pair(ids_ptr, ids_ptr, tl.minimum(p, P - 1), topk, n_routed)[1]
    less = tl.zeros([BLOCK], dtype=tl.int32)
    same = tl.zeros([BLOCK], dtype=tl.int32)
    before = tl.zeros([BLOCK], dtype=tl.int32)
    for c0 in range(0, P, BLOCK):
        q = c0 + tl.arange(0, BLOCK)
        q_live = q < P
        eq = pair(ids_ptr, ids_ptr, tl.minimum(q, P - 1), topk, n_routed)[1]
        lt = (eq[None, :] < e[:, None]) & q_live[None, :]
        eqm = (eq[None, :] == e[:, None]) & q_live[None, :]
        less += tl.sum(lt.to(tl.int32), axis=1)
        same += tl.sum(eqm.to(tl.int32), axis=1)
        before += tl.sum((eqm & (q[None, :] < p[:, None])).to(tl.int32), axis=1)
    s = less + before
    tl.store(order_ptr + s, p, mask=live)
    tl.store(end_ptr + s, less + same, mask=live)
    # a group starts where the offset in the run is a multiple of GROUP; lead holds the flags until listed
    tl.store(lead_ptr + s, (before % GROUP == 0).to(tl.int32), mask=live)
    release_fence()
    if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == tl.num_programs(0) - 1:
        run = 0
        for c0 in range(0, P, BLOCK):
            s = c0 + tl.arange(0, BLOCK)
            s_live = s < P
            flag = tl.load(lead_ptr + s, mask=s_live, other=0, cache_modifier=".cg")
            at = run + tl.cumsum(flag, axis=0) - flag
            tl.debug_barrier()  # every flag of this block read before any leader overwrites one
            tl.store(lead_ptr + at, s, mask=s_live & (flag > 0))
            run += tl.sum(flag, axis=0)
        tl.store(nlead_ptr, run)
        tl.atomic_xchg(cnt_ptr, 0)


@dataclass(frozen=True)
class PairOrder:
    """The ordering kernel's outputs: pairs by sorted position, their runs' ends, the group leaders and count, and
    a bound on the leaders that sizes the grids (a static shape, so a step can be captured)."""

    order: torch.Tensor  # int32 [P]
    end: torch.Tensor  # int32 [P]
    leaders: torch.Tensor  # int32 [P]: the first nleaders[0] entries are leaders' positions
    nleaders: torch.Tensor  # int32 [1]
    bound: int


def leader_bound(tokens: int, topk: int, n_routed: int, group: int = GROUP_PAIRS) -> int:
    """The most groups `tokens` tokens' pairs can form: routed runs ceil(n / group) each over at most
    min(n_routed, routed pairs) runs, and ceil(tokens / group) of the shared expert."""
    routed = tokens * topk
    runs = min(n_routed, routed)
    most = (routed - runs) // group + runs if routed else 0
    return min(tokens * (topk + 1), most + -(-tokens // group))


def order_pairs(ids: torch.Tensor, n_routed: int, group: int = GROUP_PAIRS) -> PairOrder | None:
    """The pairs of routed ids [T, topk] (plus each token's shared expert) ordered by entry, grouped by `group`;
    None for one token, whose pairs never share an entry (the kernels then take pair i as group i: no launch)."""
    tokens, topk = ids.shape
    if tokens == 1:
        return None
    pairs = tokens * (topk + 1)
    dev = ids.device
    buf = torch.empty((3, pairs), dtype=torch.int32, device=dev)
    nlead = torch.empty((1,), dtype=torch.int32, device=dev)
    # counters() hands every launch the same buffer: each leaves its entries zeroed for the next on the stream
    _moe_order_kernel[(triton.cdiv(pairs, BLOCK),)](
        ids, buf[0], buf[1], buf[2], nlead, counters(dev, 1), pairs, topk, n_routed, GROUP=group, BLOCK=BLOCK
    )  # fmt: skip
    return PairOrder(buf[0], buf[1], buf[2], nlead, leader_bound(tokens, topk, n_routed, group))


def order_reference(ids: torch.Tensor, n_routed: int, group: int = GROUP_PAIRS) -> tuple[list, list, list]:
    """(order, end, leaders) by torch: the kernel's contract."""
    tokens = ids.shape[0]
    shared = torch.full((tokens, 1), n_routed, dtype=torch.long)
    entries = torch.cat((ids.long().clamp(0, n_routed - 1), shared), dim=1).reshape(-1)
    sorted_e, order = torch.sort(entries, stable=True)
    end = [int((sorted_e <= v).sum()) for v in sorted_e.tolist()]
    start = [int((sorted_e < v).sum()) for v in sorted_e.tolist()]
    leaders = [s for s in range(len(order)) if (s - start[s]) % group == 0]
    return order.tolist(), end, leaders


__all__ = [
    "BLOCK",
    "GROUP_PAIRS",
    "PairOrder",
    "group_at",
    "leader_bound",
    "order_pairs",
    "order_reference",
    "pair_at",
]
