"""The family's statement of every segment's dtype and shape equals what the planner writes, at every TP world."""

from __future__ import annotations

import json

import pytest
from tfc.compiler.dsv41_plan import plan_rank
from tfc.compiler.prepare import json_config, plan_json
from tfc.packs.deepseek_v41_image import SegmentSpecError, expected_segments
from tfc.packs.pack import open_pack


def _fits(shape: tuple[int, ...], want: tuple[int | None, ...]) -> bool:
    return len(shape) == len(want) and all(w is None or w == x for x, w in zip(shape, want, strict=True))


def _as_recorded(value):
    """A value as a manifest gives it back (JSON: tuples become lists)."""
    return json.loads(json.dumps(value))


SLOW = pytest.mark.slow  # the full-scale headers: seconds a world
WORLDS = [("tiny", 1), ("tiny", 2), *(pytest.param("flash", w, marks=SLOW) for w in (1, 2, 4, 8))]


@pytest.mark.parametrize(("which", "world"), WORLDS)
def test_every_planned_segment_is_stated_with_its_dtype_and_shape(
    tiny_pack, flash_headers_pack, which, world
):
    pack = open_pack(tiny_pack if which == "tiny" else flash_headers_pack)
    config = _as_recorded(json_config(pack))
    for rank in range(world):
        plan = plan_rank(pack, world, rank, with_copies=False)
        attrs = _as_recorded(plan_json(plan))["attrs"]
        stated = expected_segments(config, world, rank, attrs, {s.name for s in plan.segments})
        for s in plan.segments:
            assert s.name in stated, (world, rank, s.name)
            dtype, shapes = stated[s.name]
            assert dtype == s.dtype and any(_fits(s.shape, shape) for shape in shapes), (s, stated[s.name])


def test_a_plan_whose_parts_do_not_fit_the_config_is_refused(tiny_pack):
    pack = open_pack(tiny_pack)
    plan = plan_rank(pack, 1, 0, with_copies=False)
    attrs = _as_recorded(plan_json(plan))["attrs"]
    attrs["head.trellis"]["part"] = [0, 10**6]
    with pytest.raises(SegmentSpecError, match=r"head\.trellis: part \[0, 1000000\] is not a range"):
        expected_segments(_as_recorded(json_config(pack)), 1, 0, attrs, {s.name for s in plan.segments})
