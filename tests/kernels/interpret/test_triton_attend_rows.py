"""The attend_rows kernel (kernels/dsv41/attend_rows.py) against the torch stage and float64, interpreted.

Tiny shapes (8 heads, d 128, rope 32, window 32, 16 entries): rings and entries packed by kv_rows from random
values, masked keys pointing at rows of 0xFF bytes (NaN / inf once decoded: a masked key must add nothing),
a row whose first half-window is not there yet, one with no entry, one with no key at all (the sink alone:
0), and a row of near-flat logits, where the sink and each key weigh alike.
Errors are relative to the largest output. The logits reach ~50 here, so fp32's rounding of them alone moves
an output by ~50 * 6e-8: over 18 cases (six seeds of each case below) the kernel's fp32 online softmax
measured 1.4e-7 to 1.7e-6 from float64 and the torch stage's two-pass softmax 4.5e-7 to 3.0e-6, so the kernel
must be within 4e-6 of float64 and 8e-6 of the stage; a dropped sink, a row's entries masked, a wrong scale,
nibble order or rotation is off by 5e-2 to order 1.
A row's bits alone equal its bits among others, run after run, and with empty runs (no key there) added; the
three ways of reading keys (decoded in the runs, gathered per row, the tables decoded first) give the same bits.
"""

from __future__ import annotations

import pytest
from support.stage_checks import attend_float64, attend_inputs, attend_rows_of

TOL, STAGE_TOL = 4e-6, 8e-6
HEADS, DIM, HALF, WINDOW, TOPK = 8, 128, 16, 32, 16


def _inputs(rows: int, entries: bool, seed: int = 0, heads: int = HEADS) -> dict:
    """The stage's arguments for `rows` rows at the tiny shapes, on the CPU."""
    return attend_inputs(rows, heads, (DIM, HALF, WINDOW, TOPK), entries, seed)


def _stage(a):
    """The torch stage itself (the code as written)."""
    from tfc.runtime.models.dsv41.fast.attention import attend_rows

    return getattr(attend_rows, "stage_fn", attend_rows)(**a)


def _rel(x, want) -> float:
    return float((x.double() - want).abs().max() / want.abs().max())


def _keys(tk, way: str):
    """An AttendConfig that reads the keys one way at the tiny shapes: decoded in the runs, gathered per row,
    or the tables decoded first."""
    never = 1 << 40
    config = {
        "runs": {"predecode_rows": never, "gather_bytes": 0},
        "gathered": {"predecode_rows": never, "gather_bytes": never},
        "tables": {"predecode_rows": 0, "predecode": 0},
    }[way]
    return tk.attend_keys.AttendConfig(**config)


def _with_empty_runs(a: dict, keys: int) -> dict:
    """a with `keys` more masked window keys a row (reading the ring's 0xFF row): runs with no key there."""
    import torch

    rows = a["read"].shape[0]
    read = torch.full((rows, keys), a["ring"].shape[0] - 1, dtype=torch.int64)
    return a | {"read": torch.cat((a["read"], read), 1),
                "valid": torch.cat((a["valid"], torch.zeros(rows, keys, dtype=torch.bool)), 1)}  # fmt: skip


@pytest.mark.parametrize(("entries", "heads"), [(True, HEADS), (False, HEADS), (True, 20)])
def test_attend_rows_matches_the_stage_and_float64(tk, entries, heads):
    """20 heads: two programs of heads, the second part masked (a tensor-parallel rank's count may be any)."""
    import torch

    a = _inputs(4, entries, heads=heads)
    got = tk.attend_rows.attend_rows(**a)
    want, stage = attend_float64(a, DIM), _stage(a)
    assert got.dtype == torch.float32 and got.shape == (4, heads, DIM)
    assert torch.isfinite(got).all()
    assert torch.equal(got[3], torch.zeros_like(got[3])), "no key at all: the sink alone, nothing out"
    runs = 4 * tk.attend_rows.blocks(DIM)[1]  # a run's keys: the runs added read nothing and add nothing
    padded = _with_empty_runs(a, 2 * runs)
    assert torch.equal(tk.attend_rows.attend_rows(**padded), got), "empty runs moved bits"
    err, stage_err = _rel(got, want), _rel(stage, want)
    assert err < TOL, (err, stage_err)
    assert _rel(got, stage.double()) < STAGE_TOL, (err, stage_err)


@pytest.mark.parametrize("entries", [True, False])
def test_attend_rows_predecoded_tables_keep_the_bits(tk, entries):
    """The key tables decoded to bf16 first (a prefill step's many rows) give the bits of the keys decoded in
    the runs: the tables hold every key's exact value, the 0xFF rows' NaN and inf included (masked, never read)."""
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import unpack_fp4, unpack_fp8

    a = _inputs(4, entries, seed=2)
    got = tk.attend_rows.attend_rows(**a, config=_keys(tk, "tables"))
    assert torch.equal(got, tk.attend_rows.attend_rows(**a, config=_keys(tk, "runs")))
    ring = tk.attend_keys.decoded_table(a["ring"], DIM, False)
    assert ring.dtype == torch.bfloat16
    assert torch.equal(ring[:-1].float(), unpack_fp8(a["ring"][:-1], DIM)), "a window key's value moved"
    if entries:
        table = tk.attend_keys.decoded_table(a["entries"], DIM, True)
        want = unpack_fp4(a["entries"], DIM, 16, True, a["grid"])
        finite = torch.isfinite(want).all(dim=1)
        assert torch.equal(table[finite].float(), want[finite]), "an entry key's value moved"


@pytest.mark.parametrize("entries", [True, False])
def test_attend_rows_gathered_keys_keep_the_bits(tk, entries):
    """Each row's own keys gathered and decoded once first (a decode step's rows, the default there) give the
    bits of the keys decoded in the runs; the gathered table holds every valid key's exact value at its row's
    positions, and keys not there are never read (the 0xFF rows' NaN and inf stay out)."""
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import unpack_fp4, unpack_fp8

    a = _inputs(4, entries, seed=6)
    assert tk.attend_keys.gathers(4, WINDOW + TOPK, DIM, False)
    got = tk.attend_rows.attend_rows(**a)
    in_runs = tk.attend_rows.attend_rows(**a, config=_keys(tk, "runs"))
    assert torch.equal(got, in_runs), "gathered keys moved bits"
    assert torch.equal(got, tk.attend_rows.attend_rows(**a, config=_keys(tk, "gathered")))
    ok8 = a["ok"].view(torch.uint8) if entries else None
    table, w_idx, e_idx = tk.attend_keys.gathered_keys(
        a["ring"], a["read"], a["valid"].view(torch.uint8), a["entries"] if entries else None,
        a["at"] if entries else None, ok8, DIM,
    )  # fmt: skip
    valid = a["valid"]
    assert torch.equal(table[w_idx[valid]].float(), unpack_fp8(a["ring"][a["read"][valid]], DIM))
    if entries:
        want = unpack_fp4(a["entries"][a["at"][a["ok"]]], DIM, 16, True, a["grid"])
        assert torch.equal(table[e_idx[a["ok"]]].float(), want)


def test_gathered_keys_keep_no_positions_made_inside_a_capture(tk, monkeypatch):
    """The rows' key positions are kept for later calls only when made outside a graph capture (a tensor made
    inside one holds its values only once that graph replays, so another graph or an eager call must not read it)."""
    import torch

    a = _inputs(2, True, seed=7)
    u8 = torch.uint8
    args = (a["ring"], a["read"], a["valid"].view(u8), a["entries"], a["at"], a["ok"].view(u8), DIM)
    monkeypatch.setattr(tk.attend_keys, "_POSITIONS", {})
    monkeypatch.setattr(tk.attend_keys, "_capturing", lambda t: True)
    tk.attend_keys.gathered_keys(*args)
    assert tk.attend_keys._POSITIONS == {}
    monkeypatch.setattr(tk.attend_keys, "_capturing", lambda t: False)
    _, w_idx, e_idx = tk.attend_keys.gathered_keys(*args)
    assert len(tk.attend_keys._POSITIONS) == 1
    assert w_idx[1, 0] == WINDOW + TOPK and e_idx[0, 0] == WINDOW


def test_attend_rows_gathers_a_decode_steps_rows_only(tk):
    """Rows gather their keys unless their tables are decoded first, up to gather_bytes a call."""
    gathers = tk.attend_keys.gathers
    assert gathers(16, 640, 512, False) and not gathers(16, 640, 512, True)
    assert not gathers(2048, 640, 512, False), "2,048 rows' keys are past gather_bytes: decoded in the runs"
    assert not gathers(16, 640, 512, False, tk.attend_keys.AttendConfig(gather_bytes=16 * 640 * 512 * 2 - 1))


def test_attend_rows_predecodes_a_prefill_steps_rows_only(tk):
    """The tables are decoded first only for many rows that would decode them several times over."""
    pre = tk.attend_keys.predecodes
    assert not pre(16, 4, 640, 2_000, 512), "a decode step's 16 rows keep decoding in the runs"
    assert pre(2048, 4, 640, 40_000, 512)
    assert not pre(2048, 4, 640, 2_000_000, 64), (
        "tables over a quarter of the runs' key reads are not decoded first"
    )
    assert not pre(4096, 4, 640, 1_500_000, 512), "tables past predecode_bytes are not decoded first"


def test_attend_rows_row_alone_and_deterministic(tk):
    import torch

    a = _inputs(3, True, seed=1)
    batch = tk.attend_rows.attend_rows(**a)
    assert torch.equal(tk.attend_rows.attend_rows(**a), batch), "two runs must give the same bits"
    for r in range(3):
        one = attend_rows_of(a, r, r + 1)
        assert torch.equal(tk.attend_rows.attend_rows(**one), batch[r : r + 1]), f"row {r} alone differs"


def test_attend_rows_runs_and_row_chunks_keep_the_bits(tk):
    """A window of 160 keys is two runs (the second partly masked by its length), 40 entries one: within the
    bounds; launched in chunks of one row (the scratch bound at its least) the rows keep their bits."""
    import torch

    a = attend_inputs(3, HEADS, (DIM, HALF, 160, 40), True, seed=3)
    assert tk.attend_rows.runs(160, 40, tk.attend_rows.blocks(DIM)[1], 4) == (2, 1)
    got = tk.attend_rows.attend_rows(**a)
    want, stage = attend_float64(a, DIM), _stage(a)
    err, stage_err = _rel(got, want), _rel(stage, want)
    assert err < TOL, (err, stage_err)
    assert _rel(got, stage.double()) < STAGE_TOL, (err, stage_err)
    one_a_launch = tk.attend_keys.AttendConfig(max_scratch=1)
    alone = tk.attend_rows.attend_rows(**a, config=one_a_launch)
    assert torch.equal(alone, got), "rows launched one at a time differ"


def test_attend_rows_refuses_what_it_does_not_take(tk):
    import torch

    a = _inputs(2, True)
    with pytest.raises(ValueError, match="ring must"):
        tk.attend_rows.attend_rows(**(a | {"ring": a["ring"][:, :-1]}))
    with pytest.raises(ValueError, match="head_dim"):
        tk.attend_rows.attend_rows(**(a | {"q": torch.zeros(2, HEADS, 96)}))
    with pytest.raises(ValueError, match="at must"):
        tk.attend_rows.attend_rows(**(a | {"at": a["at"].int()}))


def test_attend_rows_refuses_a_run_split_that_is_not_a_power_of_two(tk):
    """split_blocks sizes one tl.arange of a run's keys: 3 would fail inside Triton's compiler, so it is refused
    in one line before any launch."""
    a = _inputs(1, True)
    with pytest.raises(ValueError, match="split_blocks must be a power of two, got 3"):
        tk.attend_rows.attend_rows(**a, config=tk.attend_keys.AttendConfig(split_blocks=3))
