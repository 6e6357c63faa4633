"""The Triton EXL3 decode against the reference, under the CPU interpreter (see conftest.py).

Inputs are random (never zero), outputs are poisoned with NaN before every launch.
(Under a second a case: in the fast lane.)
"""

from __future__ import annotations

import pytest
from support.exl3_inputs import random_group, seeded


@pytest.mark.parametrize(("width", "cb"), [(16, 0), (40, 2), (96, 1), (128, 2)], ids=lambda v: str(v))
def test_decode_kernel(tk, width, cb):
    import numpy as np
    import torch

    ref = tk.exl3_reference
    rng = seeded(f"decode_{width}_{cb}")
    (tr, suh, svh, _), dense = random_group(ref, rng, 128, 256, width, cb)
    out = torch.full((128, 256), float("nan"), dtype=torch.float16)
    tk.exl3_decode.exl3_decode(tr, suh, svh, cb, rotated=True, out=out)
    want = ref.decode_rotated(tr.numpy(), cb).view(np.uint16)
    assert (out.numpy().view(np.uint16) == want).all(), (
        "rotated-domain decode differs from the reference bits"
    )
    full = torch.full((128, 256), float("nan"), dtype=torch.float32)
    tk.exl3_decode.exl3_decode(tr, suh, svh, cb, out=full)
    assert full.isfinite().all()
    err = float((full.double() - dense.double()).abs().max() / dense.abs().max())
    assert err < 1e-5, err
