"""The stage kernels' number formats (kernels/dsv41/stage_tl.py) against kv_rows.py's torch code, bit for bit, interpreted.

Exact by construction: every function is integer work on the bits or a product by a power of two, so each must
give torch's bytes and values for every input, ties and signed zeros included.
"""

from __future__ import annotations

import pytest

_FN = {}  # the function the interpreted kernel applies (a global: the interpreter resolves no closures)


def _apply(tk, name: str, x):
    """tk.stage_tl.<name> applied to a 1-D tensor x, in one interpreted launch."""
    import torch
    import triton
    import triton.language as tl

    _FN["f"] = getattr(tk.stage_tl, name)

    @triton.jit
    def kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + i, _FN["f"](tl.load(x_ptr + i, mask=i < n)), mask=i < n)

    out_dtype = torch.float32 if name.endswith("value") or name in ("pow2", "negate") else torch.int32
    out = torch.empty(x.shape, dtype=out_dtype)
    kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
    return out


def _values():
    import torch

    gen = torch.Generator().manual_seed(3)
    spread = torch.randn(20000, generator=gen) * torch.exp2(
        torch.randint(-14, 10, (20000,), generator=gen).float()
    )
    return spread


def test_e4m3_code_is_torchs_cast_and_value_its_inverse(tk):
    import torch

    x = _values().clamp(-448, 448)
    all_bytes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    finite = all_bytes[~all_bytes.isnan()]
    mids = (finite.sort().values[1:] + finite.sort().values[:-1]) / 2  # every tie between neighbours
    x = torch.cat(
        (x, finite, mids.clamp(-448, 448), torch.tensor([0.0, -0.0, 448.0, -448.0, 2**-10, -(2**-10)]))
    )
    got = _apply(tk, "e4m3_code", x)
    assert torch.equal(got, x.to(torch.float8_e4m3fn).view(torch.uint8).to(torch.int32))
    codes = torch.arange(256, dtype=torch.int32)
    codes = codes[(codes & 127) != 127]  # the two NaN bytes
    values = _apply(tk, "e4m3_value", codes)
    want = codes.to(torch.uint8).view(torch.float8_e4m3fn).float()
    assert torch.equal(values.view(torch.int32), want.view(torch.int32))


def test_ue8m0_and_pow2_exponents(tk):
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import pow2_exponent, ue8m0_values

    b = torch.arange(255, dtype=torch.int32)
    assert torch.equal(_apply(tk, "ue8m0_value", b), ue8m0_values(b.to(torch.uint8)))
    e = torch.arange(-126, 128, dtype=torch.int32)
    assert torch.equal(_apply(tk, "pow2", e), torch.ldexp(torch.ones(e.shape), e))
    t = _values().abs().clamp_min(1e-30)
    t = torch.cat((t, torch.exp2(torch.arange(-120, 120).float())))
    assert torch.equal(_apply(tk, "pow2_ceil_exp", t), pow2_exponent(t).to(torch.int32))


@pytest.mark.parametrize("scale", [1.0, 0.1])
def test_e2m1_code_is_kv_rows_and_value_its_table(tk, scale):
    import torch
    from tfc.runtime.models.dsv41.fast.kv.rows import Fp4Grid, e2m1_codes

    grid = Fp4Grid.on(torch.device("cpu"))
    q = (torch.randn(20000, generator=torch.Generator().manual_seed(5)) * 3 * scale).clamp(-6, 6)
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.0, 6.0])
    q = torch.cat((q, ties, -ties, grid.values, -grid.values))
    assert torch.equal(_apply(tk, "e2m1_code", q), e2m1_codes(q, grid).to(torch.int32))
    c = torch.arange(16, dtype=torch.int32)
    assert torch.equal(_apply(tk, "e2m1_value", c).view(torch.int32), grid.table.view(torch.int32))


def test_negate_is_torchs_negation_signed_zeros_included(tk):
    import torch

    x = torch.cat((_values(), torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 448.0, 2**-149])))
    assert torch.equal(_apply(tk, "negate", x).view(torch.int32), (-x).view(torch.int32))
