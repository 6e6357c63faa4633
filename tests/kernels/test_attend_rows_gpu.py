"""The attend_rows kernel at DeepSeek-V4.1-Flash shapes on a CUDA GPU (skipped without one).

64 heads (8 on a tensor-parallel rank), d 512, rope 64, window 128, 512 entries: the checks of
tests/kernels/interpret/test_triton_attend_rows.py (float64 and the torch stage, masked keys on rows of 0xFF
bytes, a row with no key at all giving 0, a row of near-flat logits) at 1, 16 and 256 rows; a row's bits the
same alone, among 16 and among 256, run after run, with empty runs added, with the keys decoded in the runs,
gathered per row or the key tables decoded first, and inside a captured CUDA graph. Errors are relative to
the largest output; the logits reach ~60, so fp32's rounding of them alone is a few 1e-6 of an output: on the
CPU the torch stage measured up to 7e-6 from float64 (256 rows) and the kernel, interpreted at these shapes,
1.3e-6 (16 rows), and on the H200 the stage itself was 1.29e-5 from float64 at 256 rows (the logits'
rounding grows with their size), so the kernel must be within 2e-5 of float64 and of the stage (a GPU's exp
is ex2.approx); dropping one entry key of the flat row is off by 7e-5, the sink by 8e-3, a wrong format or
rotation by order 1.
"""

from __future__ import annotations

import pytest
from support.stage_checks import attend_float64, attend_inputs, attend_rows_of

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

TOL, STAGE_TOL = 2e-5, 2e-5
DIM, HALF, WINDOW, TOPK = 512, 32, 128, 512


def _inputs(rows: int, heads: int = 64, entries: bool = True, seed: int = 0) -> dict:
    """The stage's arguments for `rows` rows at the Flash shapes, built on the CPU, on the GPU."""
    from tfc.runtime.models.dsv41.fast.kv.rows import Fp4Grid

    args = attend_inputs(rows, heads, (DIM, HALF, WINDOW, TOPK), entries, seed, q_scale=1.5)
    args = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
    if entries:
        args["grid"] = Fp4Grid.on(torch.device("cuda"))
    return args


def _stage(a):
    """The torch stage as written (fp32, TF32 off)."""
    from tfc.runtime.models.dsv41.fast.attention import attend_rows

    was = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return getattr(attend_rows, "stage_fn", attend_rows)(**a)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = was


def _rel(x, want) -> float:
    return float((x.double() - want).abs().max() / want.abs().max())


def _keys(way: str):
    """An AttendConfig that reads the keys one way: decoded in the runs, gathered per row, or the tables first."""
    from tfc.kernels.dsv41.attend_keys import AttendConfig

    never = 1 << 40
    config = {
        "runs": {"predecode_rows": never, "gather_bytes": 0},
        "gathered": {"predecode_rows": never, "gather_bytes": never},
        "tables": {"predecode_rows": 0, "predecode": 0},
    }[way]
    return AttendConfig(**config)


@pytest.mark.parametrize(("rows", "heads", "entries"),
                         [(1, 64, True), (16, 64, True), (256, 64, True), (16, 64, False), (16, 8, True)])  # fmt: skip
def test_attend_rows_matches_float64_and_the_stage(rows, heads, entries):
    from tfc.kernels.dsv41.attend_rows import attend_rows

    a = _inputs(rows, heads, entries)
    got = attend_rows(**a)
    torch.cuda.synchronize()
    assert got.dtype == torch.float32 and got.shape == (rows, heads, DIM)
    assert torch.isfinite(got).all()
    if rows > 3:
        assert torch.equal(got[3], torch.zeros_like(got[3])), "no key at all: the sink alone, nothing out"
    want, stage = attend_float64(a, DIM), _stage(a)
    err, stage_err = _rel(got, want), _rel(stage, want)
    assert err < TOL, (err, stage_err)
    assert _rel(got, stage.double()) < STAGE_TOL, (err, stage_err)


def test_attend_rows_bits_do_not_depend_on_the_rows_beside():
    from tfc.kernels.dsv41.attend_rows import attend_rows

    a = _inputs(256, seed=1)
    batch = attend_rows(**a)
    assert torch.equal(attend_rows(**a), batch), "two runs must give the same bits"
    # rows 1, 5, ... have their first run of window keys empty, rows 2, 3, ... no entry, rows 3, 7, ... no key;
    # two more runs of masked window keys a row read nothing and add nothing
    rows, extra = a["read"].shape[0], 256
    masked = torch.full((rows, extra), a["ring"].shape[0] - 1, dtype=torch.int64, device="cuda")
    padded = a | {"read": torch.cat((a["read"], masked), 1),
                  "valid": torch.cat((a["valid"], torch.zeros_like(masked, dtype=torch.bool)), 1)}  # fmt: skip
    assert torch.equal(attend_rows(**padded), batch), "empty runs moved bits"
    assert torch.equal(attend_rows(**attend_rows_of(a, 0, 16)), batch[:16]), (
        "16 rows differ from the same among 256"
    )
    assert torch.equal(attend_rows(**attend_rows_of(a, 100, 116)), batch[100:116])
    for r in (0, 1, 2, 5, 255):
        assert torch.equal(attend_rows(**attend_rows_of(a, r, r + 1)), batch[r : r + 1]), (
            f"row {r} alone differs"
        )


def test_attend_rows_predecoded_tables_keep_the_bits():
    """The key tables decoded to bf16 first (the default at 256 rows) give the bits of the keys decoded in the
    runs and gathered per row (the default at 16)."""
    from tfc.kernels.dsv41.attend_keys import predecodes
    from tfc.kernels.dsv41.attend_rows import attend_rows, blocks

    a = _inputs(256, seed=3)
    hb = 64 // blocks(DIM)[0]
    tables = a["ring"].shape[0] + a["entries"].shape[0]
    keys = WINDOW + TOPK
    assert predecodes(256, hb, keys, tables, DIM) and not predecodes(16, hb, keys, tables, DIM)
    got = attend_rows(**a)
    assert torch.equal(got, attend_rows(**a, config=_keys("runs"))), "decoded tables moved bits"
    assert torch.equal(got, attend_rows(**a, config=_keys("tables")))
    assert torch.equal(got, attend_rows(**a, config=_keys("gathered"))), "gathered keys moved bits"


def test_attend_rows_gathered_keys_keep_the_bits():
    """A decode step's 16 rows gather their own keys (the default there) and give the bits of the keys decoded
    in the runs and of the whole tables decoded first."""
    from tfc.kernels.dsv41.attend_keys import gathers
    from tfc.kernels.dsv41.attend_rows import attend_rows

    a = _inputs(16, seed=5)
    assert gathers(16, WINDOW + TOPK, DIM, False)
    got = attend_rows(**a)
    assert torch.equal(got, attend_rows(**a, config=_keys("runs"))), "gathered keys moved bits"
    assert torch.equal(got, attend_rows(**a, config=_keys("tables")))


def test_attend_rows_in_a_cuda_graph():
    """No host sync and no allocation but the output: it captures, and a replay gives the eager bits."""
    from tfc.kernels.dsv41.attend_rows import attend_rows

    a = _inputs(16, seed=2)
    eager = attend_rows(**a)  # the warm-up compiles the kernel before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attend_rows(**a)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
