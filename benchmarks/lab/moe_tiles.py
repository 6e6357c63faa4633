#!/usr/bin/env python3
"""Open question: the prefill MoE's tiles are bound by latency, not by their instructions: what hides it?

The tiles (`kernels/exl3/rows.py`, `moe_rows` on the tiles) alone at DeepSeek-V4.1-Flash's shapes, for timing and for
Nsight Compute: ragged tables of 384 routed experts (2-6 bits, the fixture's odds) and a 6-bit shared one,
5,120 x 2,304 (gate, up) and 2,304 x 5,120 (down), MUL1, 2,048 tokens routed top-6 at random: what a 2,048-row
prefill step launches, thousands of programs. It prints the median time of the MoE call (its rotations, sorts and
gathers, and the three tables' tile launches) and weights / that time, a lower bound of the tiles' decode rate
(each expert decoded once a tile of rows).

    python3 benchmarks/lab/moe_tiles.py --out $OUT/moe_tiles.json
    ncu -k regex:_rows_kernel --launch-skip 3 --launch-count 1 --section WarpStateStats --section SchedulerStats \
        python3 benchmarks/lab/moe_tiles.py --ncu
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _common import cuda_timed as timed
from _common import ensure_tfc

ensure_tfc()

import torch  # noqa: E402

D, INTER, ROUTED, TOP_K, TOKENS, MUL1 = 5120, 2304, 384, 6, 2048, 2
BITS, ODDS = (2, 3, 4, 5, 6), (0.55, 0.3, 0.1, 0.04, 0.01)  # fixtures/flash_headers.py, blocks 4-35


def tables(gen: torch.Generator) -> list:
    """(w1, w3, w2) ragged expert tables of random trellis words on the GPU, the shared expert (6 bits) last."""
    from tfc.kernels.exl3.expert_table import ExpertTable

    bits = [*random.Random(0).choices(BITS, weights=ODDS, k=ROUTED), 6]
    out = []
    for k, n in ((D, INTER), (D, INTER), (INTER, D)):
        groups = []
        for b in bits:
            trellis = torch.randint(-(2**15), 2**15, (k // 16, n // 16, 16 * b), dtype=torch.int32, device="cuda",
                                    generator=gen).to(torch.int16)  # fmt: skip
            signs = torch.randint(0, 2, (k + n,), device="cuda", generator=gen).half() * 2 - 1
            groups.append((trellis, signs[:k], signs[k:], MUL1))
        out.append(ExpertTable.build(groups, layout="ragged"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="JSON file to write (timing mode)")
    ap.add_argument("--ncu", action="store_true", help="run the default launches three times, nothing else")
    args = ap.parse_args()
    from tfc.kernels.exl3 import rows as exl3_rows

    gen = torch.Generator(device="cuda").manual_seed(0)
    w1, w3, w2 = tables(gen)
    x = torch.randn(TOKENS, D, device="cuda", generator=gen)
    ids = torch.stack([torch.randperm(ROUTED, device="cuda", generator=gen)[:TOP_K] for _ in range(TOKENS)])
    wts = torch.rand(TOKENS, TOP_K, device="cuda", generator=gen) + 0.05

    def moe():
        return exl3_rows.moe_rows(x, ids, wts, w1, w3, w2, swiglu_limit=10.0, scratch=False)

    if args.ncu:
        for _ in range(3):
            moe()
        torch.cuda.synchronize()
        return
    weights = (
        3 * (ROUTED + 1) * D * INTER
    )  # each expert decoded once a tile; most have one tile at 2,048 tokens
    res: dict = {"device": torch.cuda.get_device_name(), "tokens": TOKENS, "weights_a_call": weights}
    s = timed(moe, reps=10)
    res.update(s=s, gweights_s=weights / s / 1e9)
    print(res, flush=True)
    if args.out:
        args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
