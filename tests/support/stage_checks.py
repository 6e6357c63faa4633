"""Checks the stage kernels' interpreter and GPU tests share: the attention in float64, its rows alone, a packed row's code steps."""

from __future__ import annotations


def attend_float64(a: dict, dim: int):
    """attend_rows' maths in float64 on the decoded keys of its arguments `a` (the same bytes, exact in fp32)."""
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import unpack_fp4, unpack_fp8
    from tfc.runtime.models.dsv41.reference.rope import apply_rope

    q = a["q"].double()
    keys, valid = unpack_fp8(a["ring"][a["read"]], dim), a["valid"]
    if "entries" in a:
        keys = torch.cat((keys, unpack_fp4(a["entries"][a["at"]], dim, 16, True, a["grid"])), dim=1)
        valid = torch.cat((valid, a["ok"]), dim=1)
    keys = torch.where(valid.unsqueeze(-1), keys, 0.0).double()
    logits = torch.einsum("rhd,rkd->rhk", q, keys) * dim**-0.5
    logits = logits.masked_fill(~valid.unsqueeze(1), float("-inf"))
    sink = a["sinks"].double().view(1, -1, 1).expand(q.shape[0], -1, 1)
    probs = torch.softmax(torch.cat((logits, sink), dim=-1), dim=-1)[..., :-1]
    out = torch.einsum("rhk,rkd->rhd", probs, keys)
    return apply_rope(out, a["cos"].double()[:, None], a["sin"].double()[:, None], inverse=True)


def attend_rows_of(a: dict, lo: int, hi: int) -> dict:
    """attend_rows' arguments `a` for rows [lo, hi) alone (the per-row tensors sliced, the shared ones kept)."""
    per_row = ("q", "read", "valid", "cos", "sin", "at", "ok")
    return {k: (v[lo:hi] if k in per_row else v) for k, v in a.items()}


def code_steps(got, want, n: int, fp8: bool, grid):
    """(got's values, want's values, one code step) of two packed window (fp8) or index key rows of n values:
    where the two differ, a kernel whose norm rounds otherwise may move a value by one step at most."""
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import ue8m0_values, unpack_fp4, unpack_fp8

    split = n if fp8 else n // 2
    scale = torch.maximum(ue8m0_values(got[:, split:]), ue8m0_values(want[:, split:])).repeat_interleave(
        32, 1
    )
    if fp8:
        a, b = unpack_fp8(got, n), unpack_fp8(want, n)
        return a, b, torch.maximum(a.abs(), b.abs()) / 8 + scale * 2.0**-9
    a, b = unpack_fp4(got, n, 32, False, grid), unpack_fp4(want, n, 32, False, grid)
    return a, b, 2 * scale


def attend_inputs(rows: int, heads: int, shape: tuple[int, int, int, int], entries: bool, seed: int = 0,
                  q_scale: float = 3.0) -> dict:  # fmt: skip
    """attend_rows' arguments on the CPU for `rows` rows, shape (head dim, rope pairs, window, top-k): FP8 rings
    and FP4 entries packed from values at scales 2**-4 to 2**3, masked keys reading an all-0xFF row, rows with
    half their window or all their entries or every key masked, row 0 with near-flat logits."""
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import Fp4Grid, pack_fp4, pack_fp8

    dim, half, window, topk = shape
    g = torch.Generator().manual_seed(seed)

    def spread(n: int) -> torch.Tensor:
        scale = torch.exp2(torch.randint(-4, 4, (n, 1), generator=g).float())
        return torch.randn(n, dim, generator=g) * scale

    ring = pack_fp8(spread(3 * window))
    ring[-1] = 255  # the row every masked window key reads
    read = torch.randint(0, ring.shape[0] - 1, (rows, window), generator=g)
    valid = torch.rand(rows, window, generator=g) > 0.2
    valid[1::4, : window // 2] = False  # near position 0: half the window not written yet
    valid[3::4] = False
    read[~valid] = ring.shape[0] - 1
    angle = torch.rand(rows, half, generator=g) * 6.3
    args = {"q": torch.randn(rows, heads, dim, generator=g) * q_scale, "ring": ring, "read": read, "valid": valid,
            "sinks": torch.randn(heads, generator=g) * 2.0, "cos": angle.cos(), "sin": angle.sin()}  # fmt: skip
    args["q"][0] *= 0.05  # flat logits: the sink weighs as much as a key
    if entries:
        grid = Fp4Grid.on(torch.device("cpu"))
        pool = pack_fp4(spread(2 * topk), 16, True, grid)
        pool[-1] = 255
        at = torch.randint(0, pool.shape[0] - 1, (rows, topk), generator=g)
        ok = torch.rand(rows, topk, generator=g) > 0.3
        ok[2::4] = False
        ok[3::4] = False
        at[~ok] = pool.shape[0] - 1
        args |= {"entries": pool, "at": at, "ok": ok, "grid": grid}
    return args
