"""The Triton MoE over expert tables (stacked and ragged layouts) against the torch reference, and its input
rotation as fp16 high / low pairs, under the CPU interpreter (see conftest.py).

Inputs are random (never zero), outputs are poisoned with NaN before every launch; the SwiGLU clamp must matter
on these inputs (else the test could not see it dropped).
"""

from __future__ import annotations

import pytest
from support.exl3_inputs import random_group, seeded

D, INTER, ROUTED, TOPK, TOKENS, LIMIT = 128, 256, 4, 2, 2, 0.3
MODES = {
    ("stack", "rotate"): {},
    ("stack", "gather"): {"runs": False},
    ("stack", "runs_t4"): {"run_tiles": 4, "block_k": 128},
    # k-splits that do not divide the k-tiles (8 / 3, 16 / 5): the counts differ by one, as the mma decode's
    # even_split gives them on the GPU; the down projection's 15 partials take two MoeConfig.reduce_flight rounds
    ("stack", "gather_uneven"): {"runs": False, "block_k": 16, "split_gate_up": 3, "split_down": 5},
    ("ragged", "rotate"): {},
    ("ragged_int", "runs"): {},
}
# The run decode takes ~10x the gather's time under the interpreter, so its modes route one token (its two experts
# and the shared one); the gather and ragged modes route TOKENS.
RUN_DECODE = {("stack", "rotate"), ("stack", "runs_t4"), ("ragged_int", "runs")}
_INPUTS: dict[tuple[str, int], tuple] = {}


def _specs(layout: str, proj: int) -> list[tuple[int, int]]:
    """(width, codebook) per table entry (routed experts, then the shared one)."""
    if layout == "stack":
        return [(32, 2)] * (ROUTED + 1)
    if layout == "ragged_int":  # integer widths, one codebook: the run decode per width
        return [(w, 2) for w in (32, 48, 64, 80, 128)]
    # mixed widths (half rates on mul1) and, for w3, mixed codebooks
    return [(w, 2 if w % 16 or proj != 1 else e % 3) for e, w in enumerate((24, 32, 48, 40, 64))]


def moe_inputs(tk, layout: str, tokens: int = TOKENS):
    """Tables (w1, w3, w2), x, ids, weights and the clamped and unclamped references: built once per layout and
    token count."""
    if (layout, tokens) not in _INPUTS:
        import torch

        rng = seeded(f"moe_{layout}")
        tables, dense = [], []
        for proj, (k, n) in enumerate([(D, INTER), (D, INTER), (INTER, D)]):
            gs = [random_group(tk.exl3_reference, rng, k, n, w, c) for w, c in _specs(layout, proj)]
            tables.append(
                tk.expert_table.ExpertTable.build([g[0] for g in gs], layout=layout.removesuffix("_int"))
            )
            dense.append([g[1] for g in gs])
        x = torch.randn(tokens, D).to(torch.float16)
        ids = torch.stack([torch.randperm(ROUTED)[:TOPK] for _ in range(tokens)])
        wts = torch.rand(tokens, TOPK) + 0.1
        want = tk.moe_exl3.moe_reference(x, ids, wts, *dense, swiglu_limit=LIMIT)
        unclamped = tk.moe_exl3.moe_reference(x, ids, wts, *dense, swiglu_limit=0.0)
        _INPUTS[layout, tokens] = (tables, x, ids, wts, want, unclamped)
    return _INPUTS[layout, tokens]


# 3-30 s a case under the interpreter: the full suite only, but for the uneven splits (the reduce's masked and
# two-round paths too, ~3 s), which keep the MoE in the fast lane.
PARAMS = [
    pytest.param(
        la, m, id=f"{la}_{m}", marks=() if (la, m) == ("stack", "gather_uneven") else pytest.mark.slow
    )
    for la, m in MODES
]


@pytest.mark.parametrize(("layout", "mode"), PARAMS)
def test_moe_kernel(tk, layout, mode):
    import torch

    tables, x, ids, wts, want, unclamped = moe_inputs(
        tk, layout, 1 if (layout, mode) in RUN_DECODE else TOKENS
    )
    assert (unclamped - want).norm() / want.norm() > 1e-2, "the test inputs must exercise the SwiGLU clamp"
    y = torch.full(x.shape, float("nan"), dtype=torch.float32)
    m = tk.moe_exl3
    m.moe_exl3(x, ids, wts, *tables, swiglu_limit=LIMIT, config=m.MoeConfig(**MODES[layout, mode]), out=y)
    err = float((y.double() - want).norm() / want.norm())
    assert err < 1e-5, err
    w1, w3 = tables[0], tables[1]
    if layout == "ragged_int":
        assert w1.width == 0 and w3.codebook == 2 and w1.integer_widths  # the run decode, a width per entry
    elif layout == "ragged":
        assert w1.width == 0 and w3.codebook == -1  # mixed widths and codebooks: the run-time paths
    else:
        assert w1.width == 32 and w3.codebook == 2


def test_moe_rotation_pairs(tk):
    """The MoE input rotation as fp16 high / low pairs (the mma decode's input): the high part is the fp16
    rounding of the fp32 rotation and the pair sums back to it within ~2^-22."""
    import torch

    tables, x, ids, _, _, _ = moe_inputs(tk, "stack")
    pairs, outs = TOKENS * (TOPK + 1), {}
    for split in (False, True):
        shape = (2, pairs, 2, D) if split else (2, pairs, D)
        xh = torch.full(shape, float("nan"), dtype=torch.float16 if split else torch.float32)
        tk.moe_exl3._moe_rotate_kernel[(D // 128, pairs, 2)](
            x, ids, torch.arange(pairs, dtype=torch.int32), tables[0].suh, tables[1].suh, xh, torch.empty(2, pairs, D),
            pairs, D, x.stride(0), TOPK, ROUTED, PAIRS=split,
        )  # fmt: skip
        outs[split] = xh
    hi, lo, f32 = outs[True][:, :, 0], outs[True][:, :, 1], outs[False]
    assert torch.equal(hi, f32.half())
    err = float(((hi.double() + lo.double()) - f32.double()).abs().max() / f32.abs().max())
    assert err < 1e-6, err
