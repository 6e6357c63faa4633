"""Placement: tiers by budget (hot path on the device, Engram rows off it first, then whole layers' routed experts,
spread evenly), one-line refusals naming what to change, determinism, and the full-scale Flash targets."""

from __future__ import annotations

import pytest
from tfc.compiler.dsv41_family import PLANNER
from tfc.compiler.placement import GIB, Budget, PlacementError, PlacementRules, place, spread
from tfc.compiler.segments import RankPlan, SegmentPlan
from tfc.compiler.world_plan import plan_world
from tfc.packs.pack import open_pack

LAYERS = 8


def _seg(name: str, block: str, kind: str, nbytes: int, **attrs) -> SegmentPlan:
    return SegmentPlan(name, block, kind, "native.v1", "uint8", (nbytes,), nbytes, attrs=attrs)


def _plan(
    rank: int = 0, world: int = 1, hot: int = 2 * GIB, expert: int = GIB, rows: int = 3 * GIB
) -> RankPlan:
    """A synthetic rank: `hot` bytes of natives, 8 layers' routed tables, two Engram layers, one DSpark table."""
    segs = [_seg("embed.weight", "top", "natives", hot)]
    for layer in range(LAYERS):
        block = f"layers.{layer}"
        segs.append(_seg(f"{block}.attn.wq_b.trellis", block, "other_trellis", 1 << 20))
        segs.append(_seg(f"{block}.ffn.experts.w1.trellis", block, "routed_trellis", expert))
        if layer in (1, 5):
            segs.append(_seg(f"{block}.engram.rows", block, "engram_rows", rows, layer=layer))
    segs.append(_seg("mtp.0.ffn.experts.w1.trellis", "mtp.0", "routed_trellis", expert))
    return RankPlan(world, rank, tuple(segs))


RULES = PlacementRules(PLANNER.placement.movable, lambda cfg, seqs, context: seqs * context * 1000)
HOT = 2 * GIB + LAYERS * (1 << 20) + GIB  # natives, wq_b, the DSpark table
KV = 4 * 4096 * 1000  # the fake rule's KV for 4 sequences of 4,096 tokens


def _budget(gpu_bytes: int, **kw) -> Budget:
    return Budget(gpu_bytes / GIB, overhead_gib=0, max_context=4096, max_seqs=4, **kw)


def test_without_a_budget_or_with_room_everything_is_on_the_device():
    plan = _plan()
    for placed in (place([plan], RULES, None, None), place([plan], RULES, None, _budget(100 * GIB))):
        assert not placed.tiers and not placed.cold_layers
        assert placed.ranks == ({"device": plan.total, "host": 0, "nvme": 0},)
    assert place([plan], RULES, None, None).record() is None


def test_engram_rows_leave_the_device_first_in_layer_order():
    plan = _plan()
    one_row_layer = HOT + LAYERS * GIB + KV + 3 * GIB
    placed = place([plan], RULES, None, _budget(one_row_layer + 1024))
    assert dict(placed.tiers) == {"layers.5.engram.rows": "host"}  # layer 1's rows still fit
    placed = place([plan], RULES, None, _budget(one_row_layer - 1024))
    assert dict(placed.tiers) == {"layers.1.engram.rows": "host", "layers.5.engram.rows": "host"}
    assert placed.ranks[0] == {"device": plan.total - 6 * GIB, "host": 6 * GIB, "nvme": 0}
    assert placed.kv_room(0) == int(placed.budget.gpu_gib * GIB) - placed.ranks[0]["device"]


def test_cold_experts_are_the_fewest_whole_layers_spread_evenly_and_dspark_stays():
    plan = _plan()
    placed = place([plan], RULES, None, _budget(HOT + 5 * GIB + KV + 1024))
    assert placed.cold_layers == (1, 4, 6) == tuple(spread(range(LAYERS), 3))
    assert {n for n, t in placed.tiers.items() if t == "host"} == {
        "layers.1.ffn.experts.w1.trellis", "layers.4.ffn.experts.w1.trellis", "layers.6.ffn.experts.w1.trellis",
        "layers.1.engram.rows", "layers.5.engram.rows",
    }  # fmt: skip
    assert placed.tier("mtp.0.ffn.experts.w1.trellis") == "device"
    assert placed.device_need(0) <= int(placed.budget.gpu_gib * GIB)
    # one byte less room: one more cold layer, and the set moves to stay spread
    assert place([plan], RULES, None, _budget(HOT + 5 * GIB + KV - 1)).cold_layers == (1, 3, 5, 7)


def test_host_budget_sends_engram_rows_to_nvme_or_refuses_naming_the_fixes():
    plan = _plan()
    gpu = HOT + 5 * GIB + KV + 1024  # three cold layers: 3 GiB of experts in host memory
    placed = place([plan], RULES, None, _budget(gpu, host_gib=6.5, nvme_dir="/nvme/tfc"))
    assert placed.tier("layers.1.engram.rows") == "host" and placed.tier("layers.5.engram.rows") == "nvme"
    assert placed.ranks[0]["nvme"] == 3 * GIB and placed.record()["inputs"]["nvme_dir"] == "/nvme/tfc"
    with pytest.raises(PlacementError) as info:
        place([plan], RULES, None, _budget(gpu, host_gib=6.5))
    assert "layers.5.engram.rows" in str(info.value) and "--nvme DIR" in str(info.value)
    assert "--host-memory-gib" in str(info.value) and "--tp 2" in str(info.value)
    with pytest.raises(
        PlacementError, match=r"routed experts of 3 layer\(s\).*--host-memory-gib\) or more GPUs"
    ):
        place([plan], RULES, None, _budget(gpu, host_gib=2, nvme_dir="/nvme"))


def test_a_device_tier_too_large_is_one_line_naming_what_to_change():
    plan = _plan()
    with pytest.raises(PlacementError) as info:
        place([plan], RULES, None, _budget(HOT + KV - 1))
    line = str(info.value)
    assert (
        "\n" not in line and line.startswith("rank 0 needs") and "--tp 2" in line and "--overhead-gib" in line
    )
    big_kv = Budget(HOT / GIB, overhead_gib=0, max_context=1 << 20, max_seqs=64)
    with pytest.raises(PlacementError, match="--max-context or --max-seqs"):
        place([plan], RULES, None, big_kv)
    eight = [_plan(rank, 8) for rank in range(8)]
    with pytest.raises(PlacementError) as info:
        place(eight, RULES, None, _budget(HOT))
    assert "--tp" not in str(info.value)  # no larger world to suggest


def test_every_rank_gets_the_same_tiers_decided_by_the_largest():
    small, large = _plan(0, 2), _plan(1, 2, expert=GIB + (64 << 20))
    budget = _budget(HOT + 5 * GIB + KV + 1024)
    placed = place([small, large], RULES, None, budget)
    assert len(placed.cold_layers) == 4  # rank 0 alone would need 3
    assert placed == place([small, large], RULES, None, budget)  # deterministic
    for rank in (0, 1):
        assert placed.device_need(rank) <= int(budget.gpu_gib * GIB)


@pytest.mark.parametrize("n", [1, 7, 40])
def test_spread_takes_evenly_spaced_layers_in_order(n):
    layers = list(range(100, 100 + n))
    for count in range(1, n + 1):
        picked = spread(layers, count)
        assert len(set(picked)) == count and picked == sorted(picked) and set(picked) <= set(layers)
        gaps = [b - a for a, b in zip([layers[0] - 1, *picked], [*picked, layers[-1] + 1], strict=True)]
        assert max(gaps[1:-1], default=0) - min(gaps[1:-1], default=0) <= 1


def test_budget_is_one_key_for_int_and_float_sizes():
    assert Budget(141).inputs() == Budget(141.0).inputs()
    assert Budget(141, nvme_dir="rel").nvme_dir.startswith("/")
    with pytest.raises(PlacementError):
        Budget(-1)


@pytest.fixture(scope="module")
def flash(flash_headers_pack):
    return open_pack(flash_headers_pack)


def test_flash_at_tp2_fits_two_h200s_with_engram_rows_in_host_memory(flash):
    planned = plan_world(flash, 2, Budget(141, max_context=4096, max_seqs=16))
    placed = planned.placement
    assert not placed.cold_layers
    assert dict(placed.tiers) == {"layers.1.engram.rows": "host", "layers.14.engram.rows": "host"}
    for rank, plan in enumerate(planned.plans):
        rows = sum(s.nbytes for s in plan.segments if s.kind == "engram_rows")
        assert placed.ranks[rank] == {"device": plan.total - rows, "host": rows, "nvme": 0}
        assert 90 * GIB < rows < 100 * GIB and placed.device_need(rank) < 141 * GIB
    assert placed.kv_bytes < GIB // 4  # Flash's compressed KV: ~890 B a token


def test_flash_at_tp1_moves_the_fewest_spread_expert_layers_to_host_memory(flash):
    budget = Budget(141, max_context=4096, max_seqs=16)
    planned = plan_world(flash, 1, budget)
    placed, plan = planned.placement, planned.plans[0]
    cold = placed.cold_layers
    assert 0 < len(cold) < 40 and list(cold) == spread(range(40), len(cold))
    assert placed.device_need(0) <= 141 * GIB
    on_host = {s.name for s in plan.segments if placed.tier(s.name) == "host"}
    assert on_host == {
        f"layers.{layer}.ffn.experts.{p}.trellis" for layer in cold for p in ("w1", "w3", "w2")
    } | {
        "layers.1.engram.rows",
        "layers.14.engram.rows",
    }
    # the layer before did not fit: the count is the least that does
    fewer = spread(range(40), len(cold) - 1)
    device = sum(
        s.nbytes
        for s in plan.segments
        if s.kind != "engram_rows"
        and not (s.kind == "routed_trellis" and s.block.startswith("layers.") and int(s.block[7:]) in fewer)
    )
    assert device + placed.kv_bytes + placed.overhead_bytes > 141 * GIB
