"""The attend_rows kernel (kernels/attend_rows.py) against the torch stage and float64, interpreted.

Tiny shapes (8 heads, d 128, rope 32, window 32, 16 entries): rings and entries packed by kv_rows from random
values, masked keys pointing at rows of 0xFF bytes (NaN / inf once decoded: a masked key must add nothing),
a row whose first half-window is not there yet, one with no entry, one with no key at all (the sink alone:
0), and a row of near-flat logits, where the sink and each key weigh alike.
Errors are relative to the largest output. The logits reach ~50 here, so fp32's rounding of them alone moves
an output by ~50 * 6e-8: over 18 cases (six seeds of each case below) the kernel's fp32 online softmax
measured 1.4e-7 to 1.7e-6 from float64 and the torch stage's two-pass softmax 4.5e-7 to 3.0e-6, so the kernel
must be within 4e-6 of float64 and 8e-6 of the stage; a dropped sink, a row's entries masked, a wrong scale,
nibble order or rotation is off by 5e-2 to order 1.
A row's bits alone equal its bits among others, run after run.
"""

from __future__ import annotations

import pytest

TOL, STAGE_TOL = 4e-6, 8e-6
HEADS, DIM, HALF, WINDOW, TOPK = 8, 128, 16, 32, 16


def _inputs(rows: int, entries: bool, seed: int = 0, heads: int = HEADS):
    """The stage's arguments (a dict) for `rows` rows at the tiny shapes, on the CPU."""
    import torch
    from tfc.runtime.models.dsv41.fast.kv_rows import Fp4Grid, pack_fp4, pack_fp8

    g = torch.Generator().manual_seed(seed)
    grid = Fp4Grid.on(torch.device("cpu"))

    def spread(n: int) -> torch.Tensor:  # rows of values at scales from 2**-4 to 2**3
        scale = torch.exp2(torch.randint(-4, 4, (n, 1), generator=g).float())
        return torch.randn(n, DIM, generator=g) * scale

    ring = pack_fp8(spread(3 * WINDOW))
    ring[-1] = 255  # the row every masked window key reads
    read = torch.randint(0, ring.shape[0] - 1, (rows, WINDOW), generator=g)
    valid = torch.rand(rows, WINDOW, generator=g) > 0.2
    valid[1::4, : WINDOW // 2] = False  # near position 0: half the window not written yet
    valid[3::4] = False
    read[~valid] = ring.shape[0] - 1
    angle = torch.rand(rows, HALF, generator=g) * 6.3
    args = {
        "q": torch.randn(rows, heads, DIM, generator=g) * 3.0,
        "ring": ring,
        "read": read,
        "valid": valid,
        "sinks": torch.randn(heads, generator=g) * 2.0,
        "cos": angle.cos(),
        "sin": angle.sin(),
    }
    args["q"][0] *= 0.05  # flat logits: the sink weighs as much as a key
    if entries:
        pool = pack_fp4(spread(2 * TOPK), 16, True, grid)
        pool[-1] = 255
        at = torch.randint(0, pool.shape[0] - 1, (rows, TOPK), generator=g)
        ok = torch.rand(rows, TOPK, generator=g) > 0.3
        ok[2::4] = False
        ok[3::4] = False
        at[~ok] = pool.shape[0] - 1
        args |= {"entries": pool, "at": at, "ok": ok, "grid": grid}
    return args


def _float64(a) -> object:
    """The stage's maths in float64 on the decoded keys (the same bytes, exact in fp32)."""
    import torch
    from tfc.runtime.models.dsv41.fast.kv_rows import unpack_fp4, unpack_fp8
    from tfc.runtime.models.dsv41.rope import apply_rope

    q = a["q"].double()
    keys, valid = unpack_fp8(a["ring"][a["read"]], DIM), a["valid"]
    if "entries" in a:
        keys = torch.cat((keys, unpack_fp4(a["entries"][a["at"]], DIM, 16, True, a["grid"])), dim=1)
        valid = torch.cat((valid, a["ok"]), dim=1)
    keys = torch.where(valid.unsqueeze(-1), keys, 0.0).double()
    logits = torch.einsum("rhd,rkd->rhk", q, keys) * DIM**-0.5
    logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
    sink = a["sinks"].double().view(1, -1, 1).expand(q.shape[0], -1, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
    out = torch.einsum("rhk,rkd->rhd", probs, keys)
    return apply_rope(out, a["cos"].double()[:, None], a["sin"].double()[:, None], inverse=True)


def _stage(a):
    """The torch stage itself (fusion off: the code as written)."""
    from tfc.runtime.models.dsv41.fast.attention import attend_rows

    return getattr(attend_rows, "stage_fn", attend_rows)(**a)


def _rel(x, want) -> float:
    return float((x.double() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize(("entries", "heads"), [(True, HEADS), (False, HEADS), (True, 20)])
def test_attend_rows_matches_the_stage_and_float64(tk, entries, heads):
    """20 heads: two programs of heads, the second part masked (a tensor-parallel rank's count may be any)."""
    import torch

    a = _inputs(4, entries, heads=heads)
    got = tk.attend_rows.attend_rows(**a)
    want, stage = _float64(a), _stage(a)
    assert got.dtype == torch.float32 and got.shape == (4, heads, DIM)
    assert torch.isfinite(got).all()
    assert torch.equal(got[3], torch.zeros_like(got[3])), "no key at all: the sink alone, nothing out"
    err, stage_err = _rel(got, want), _rel(stage, want)
    assert err < TOL, (err, stage_err)
    assert _rel(got, stage.double()) < STAGE_TOL, (err, stage_err)


def test_attend_rows_row_alone_and_deterministic(tk):
    import torch

    a = _inputs(3, True, seed=1)
    batch = tk.attend_rows.attend_rows(**a)
    assert torch.equal(tk.attend_rows.attend_rows(**a), batch), "two runs must give the same bits"
    per_row = ("q", "read", "valid", "cos", "sin", "at", "ok")
    for r in range(3):
        one = {k: (v[r : r + 1] if k in per_row else v) for k, v in a.items()}
        assert torch.equal(tk.attend_rows.attend_rows(**one), batch[r : r + 1]), f"row {r} alone differs"


def test_attend_rows_refuses_what_it_does_not_take(tk):
    import torch

    a = _inputs(2, True)
    with pytest.raises(ValueError, match="ring must"):
        tk.attend_rows.attend_rows(**(a | {"ring": a["ring"][:, :-1]}))
    with pytest.raises(ValueError, match="head_dim"):
        tk.attend_rows.attend_rows(**(a | {"q": torch.zeros(2, HEADS, 96)}))
    with pytest.raises(ValueError, match="at must"):
        tk.attend_rows.attend_rows(**(a | {"at": a["at"].int()}))
