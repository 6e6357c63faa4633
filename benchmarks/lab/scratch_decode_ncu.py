#!/usr/bin/env python3
"""Open question: prefill at the tensor cores: how fast does the decoded scratch's decode run under Nsight?

The scratch decode (`kernels/exl3/scratch.py`, `decode_round`) alone: a 6-bit 4096 x 16384 group and a 3-bit
4096 x 4096 one decoded three times each, checked against `exl3_decode`'s W-hat.

    ncu -k regex:_decode_entries_kernel --launch-skip 1 --launch-count 2 python3 benchmarks/lab/scratch_decode_ncu.py
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import ensure_tfc

ensure_tfc()

import torch  # noqa: E402


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    from tfc.kernels.exl3 import scratch as exl3_scratch
    from tfc.kernels.exl3.decode import exl3_decode

    gen = torch.Generator(device="cuda").manual_seed(0)
    for k, n, bits in ((4096, 16384, 6), (4096, 4096, 3)):
        trellis = torch.randint(-(2**15), 2**15, (k // 16, n // 16, 16 * bits), dtype=torch.int32, device="cuda",
                                generator=gen).to(torch.int16)  # fmt: skip
        one = torch.zeros(1, dtype=torch.int64, device="cuda")
        buf = torch.empty((1, k, n), dtype=torch.float16, device="cuda")
        words = trellis.view(torch.int32).reshape(-1)
        for _ in range(3):
            exl3_scratch.decode_round(words, one, one.int() + 16 * bits, one.int() + 2, one.int() + 1, buf, 0,
                                      (16 * bits,), 2)  # fmt: skip
        suh = torch.ones(k, dtype=torch.float16, device="cuda")
        svh = torch.ones(n, dtype=torch.float16, device="cuda")
        print(
            k,
            n,
            bits,
            "exact",
            torch.equal(buf[0], exl3_decode(trellis, suh, svh, 2, rotated=True)),
            flush=True,
        )


if __name__ == "__main__":
    main()
