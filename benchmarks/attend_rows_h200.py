#!/usr/bin/env python3
"""The attention kernel (`kernels/dsv41/attend_rows.py`) alone at DeepSeek-V4.1-Flash shapes on an H100/H200: its launch
values (AttendConfig: heads a program, keys a block, key blocks a run, warps, how keys are read), at decode and prefill
row counts.

    python3 benchmarks/attend_rows_h200.py --out $OUT/attend_rows_h200.json

A compressed layer's shapes (64 heads, d 512, rope 32 pairs, a 128-key window and 512 entries), every key there
(a long context: the most work a row can have): a ring of 4,096 FP8 rows read as sliding windows, a pool of
8,192 FP4 entries read at random. For each variant (heads a program; keys a block; key blocks a run; warps; the key
tables decoded to bf16 first, each row's keys gathered and decoded first, or the keys decoded in the runs) at 1, 16
and 2,048 rows (PREFILL_ROWS): the median time between CUDA events of
a CUDA graph's replay of the whole call (both launches, no host launch work), and TFLOP/s = 4 x heads x keys x d a row (the logits and the weighted sum) over
it. Each variant is checked on the spread inputs of the tests (`support.stage_checks.attend_inputs`: masked keys
on rows of 0xFF bytes, empty runs, a flat row) at 64 rows against float64 (largest error relative to the largest
output) and against the default's bits; a row's bits alone must equal its bits among the 2,048. Beside them:
torch's bf16 product of the same two matrix shapes as a batch (the matrix units' rate on this work without the
key decode), and registers / spills of each compiled variant. `--ncu` runs the first of `--variants` at 2,048 rows
three times and nothing else, for `h200_serving.sh attendncu`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from _bench_env import compiled_stats, ensure_tfc

ensure_tfc()

import torch  # noqa: E402
from decode_h200 import graphed, timed  # noqa: E402

HEADS, DIM, HALF, WINDOW, TOPK = 64, 512, 32, 128, 512
RING_ROWS, POOL_ROWS = 4096, 8192
ROW_COUNTS = (1, 16, 2048)
PREFILL_ROWS = 2048
# name: (heads a program, keys a block, key blocks a run, warps, keys): keys "runs" decoded in the runs, "pre" the
# whole tables decoded to bf16 first (attend_keys.decoded_table), "gather" each row's own keys decoded to bf16
# first (attend_keys.gathered_keys); the names keep the earlier runs' (mma3: the three bf16 pieces)
VARIANTS = {
    "mma3_h16_k32_s4_w8": (16, 32, 4, 8, "runs"), "mma3_h32_k16_s4_w8": (32, 16, 4, 8, "runs"),
    "mma3_h16_k32_s4_w8_pre": (16, 32, 4, 8, "pre"), "mma3_h16_k64_s2_w8_pre": (16, 64, 2, 8, "pre"),
    "mma3_h32_k32_s4_w8_pre": (32, 32, 4, 8, "pre"), "mma3_h32_k64_s2_w8_pre": (32, 64, 2, 8, "pre"),
    "mma3_h16_k32_s4_w4_pre": (16, 32, 4, 4, "pre"),
    "mma3_h16_k32_s4_w4_gather": (16, 32, 4, 4, "gather"), "mma3_h16_k32_s4_w8_gather": (16, 32, 4, 8, "gather"),
    "mma3_h16_k32_s2_w4_gather": (16, 32, 2, 4, "gather"), "mma3_h16_k32_s1_w4_gather": (16, 32, 1, 4, "gather"),
    "mma3_h16_k64_s2_w8_gather": (16, 64, 2, 8, "gather"),
}  # fmt: skip
# The kernel's defaults at these shapes (AttendConfig): below predecode_rows rows mma3_h16_k32_s4_w4_gather, from
# there mma3_h16_k32_s4_w4_pre; the bits of these and of the keys decoded in the runs are equal
DEFAULT = "mma3_h16_k32_s4_w8"


def full_inputs(rows: int, gen: torch.Generator) -> dict:
    """Every key there: windows sliding over a ring of RING_ROWS FP8 rows, TOPK entries of POOL_ROWS at random."""
    from tfc.runtime.models.dsv41.fast.kv.rows import Fp4Grid, pack_fp4, pack_fp8

    dev = torch.device("cuda")
    grid = Fp4Grid.on(dev)

    def spread(n: int) -> torch.Tensor:
        scale = torch.exp2(torch.randint(-4, 4, (n, 1), device=dev, generator=gen).float())
        return torch.randn(n, DIM, device=dev, generator=gen) * scale

    pos = torch.arange(rows, device=dev)[:, None] * 7 + torch.arange(WINDOW, device=dev)[None, :]
    angle = torch.rand(rows, HALF, device=dev, generator=gen) * 6.3
    return {"q": torch.randn(rows, HEADS, DIM, device=dev, generator=gen) * 1.5, "ring": pack_fp8(spread(RING_ROWS)),
            "read": pos % RING_ROWS, "valid": torch.ones(rows, WINDOW, dtype=torch.bool, device=dev),
            "sinks": torch.randn(HEADS, device=dev, generator=gen), "cos": angle.cos(), "sin": angle.sin(),
            "entries": pack_fp4(spread(POOL_ROWS), 16, True, grid),
            "at": torch.randint(0, POOL_ROWS, (rows, TOPK), device=dev, generator=gen),
            "ok": torch.ones(rows, TOPK, dtype=torch.bool, device=dev), "grid": grid}  # fmt: skip


def spread_inputs() -> dict:
    """The tests' inputs at 64 rows (masked keys, empty runs, a flat row) on the GPU."""
    from support.stage_checks import attend_inputs
    from tfc.runtime.models.dsv41.fast.kv.rows import Fp4Grid

    a = attend_inputs(64, HEADS, (DIM, HALF, WINDOW, TOPK), True, 0, q_scale=1.5)
    a = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in a.items()}
    return a | {"grid": Fp4Grid.on(torch.device("cuda"))}


def use(variant: tuple[int, int, int, int, str]):
    """The call of attend_rows with a variant's AttendConfig."""
    from tfc.kernels.dsv41.attend_keys import AttendConfig
    from tfc.kernels.dsv41.attend_rows import attend_rows

    heads, keys_a_block, split, warps, keys = variant
    never = 1 << 40
    read = {"runs": {"predecode_rows": never, "gather_bytes": 0}, "pre": {"predecode_rows": 0, "predecode": 0},
            "gather": {"predecode_rows": never, "gather_bytes": never}}[keys]  # fmt: skip
    config = AttendConfig(heads_a_program=heads, keys_a_block=keys_a_block, split_blocks=split, num_warps=warps,
                          **read)  # fmt: skip
    return lambda a: attend_rows(**a, config=config)


def torch_bf16_rate(rows: int) -> float:
    """TFLOP/s of torch's bf16 batched products of the same shapes (q [H, d] x keys [d, K], then [H, K] x [K, d])."""
    keys = WINDOW + TOPK
    q = torch.randn(rows, HEADS, DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(rows, keys, DIM, device="cuda", dtype=torch.bfloat16)
    p = torch.randn(rows, HEADS, keys, device="cuda", dtype=torch.bfloat16)
    s = timed(lambda: (torch.bmm(q, k.transpose(1, 2)), torch.bmm(p, k)), reps=10)
    return 4 * rows * HEADS * keys * DIM / s / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
    ap.add_argument("--ncu", action="store_true",
                    help="only run the first variant at PREFILL_ROWS three times (for Nsight Compute)")  # fmt: skip
    args = ap.parse_args()
    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        ap.error(f"unknown variants {unknown or '(none given)'}; known: {', '.join(VARIANTS)}")
    from support.stage_checks import attend_float64, attend_rows_of

    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.ncu:
        call, full = use(VARIANTS[names[0]]), full_inputs(PREFILL_ROWS, gen)
        for _ in range(3):
            call(full)
        torch.cuda.synchronize()
        return
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "python": platform.python_version(), "shape": [HEADS, DIM, WINDOW, TOPK], "variants": {}}  # fmt: skip
    spread = spread_inputs()
    want = attend_float64(spread, DIM)
    full = {rows: full_inputs(rows, gen) for rows in ROW_COUNTS}
    flops = {rows: 4 * rows * HEADS * (WINDOW + TOPK) * DIM for rows in ROW_COUNTS}
    default = use(VARIANTS[DEFAULT])(spread)
    for name in names:
        call = use(VARIANTS[name])
        got = call(spread)
        big = call(full[PREFILL_ROWS])
        alone = all(
            torch.equal(call(attend_rows_of(full[PREFILL_ROWS], r, r + 1)), big[r : r + 1])
            for r in (0, 5, 2047)
        )
        out = {"err_vs_float64": float((got.double() - want).abs().max() / want.abs().max()),
               "bits_equal_default": bool(torch.equal(got, default)), "row_alone_equal": alone, "rows": {}}  # fmt: skip
        for rows in ROW_COUNTS:
            replay = graphed(lambda rows=rows, call=call: call(full[rows]))
            s = timed(replay, reps=20 if rows < PREFILL_ROWS else 10)
            out["rows"][rows] = {"s": s, "tflops": flops[rows] / s / 1e12}
        res["variants"][name] = out
        print(name, json.dumps(out), flush=True)
        Path(args.out).write_text(json.dumps(res, indent=1))
    res["torch_bf16_tflops"] = {rows: torch_bf16_rate(rows) for rows in (16, PREFILL_ROWS)}
    from tfc.kernels.dsv41 import attend_rows

    res["compiled"] = compiled_stats(attend_rows._partial_kernel)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print("torch bf16", res["torch_bf16_tflops"])


if __name__ == "__main__":
    main()
