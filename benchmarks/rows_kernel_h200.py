#!/usr/bin/env python3
"""The many-row EXL3 product (`kernels/exl3/rows.py`) alone on an H200: launch variants against the decode path's
16-row kernel on the same weight, and the registers and spills of each compiled variant.

    python3 benchmarks/rows_kernel_h200.py --out $OUT/rows_kernel_h200.json

Synthetic EXL3 groups (random trellis words, mul1 codebook, the Flash fixture's widths): a 4096 x 4096 group at
3 bits (an expert's or attention's shape) and a 4096 x 16384 group at 6 bits (a head slice). For each launch
variant of the tiles (a RowsConfig: rows a tile, warps, k rows a step, pipeline stages, register cap) at 256
rows: the median time between CUDA events,
TFLOP/s = 2 x rows x k x n / time, and the decode rate = weights decoded / time (each program decodes its
block once per tile of rows, so rows / BM tiles decode every weight). Each variant's output is checked against
x @ the weight decoded by `exl3_decode` in float64 (relative Frobenius error < 1e-5; x as the products see it,
`exl3_rotate.rows_seen`: rounded to fp16 by default) and against the first
variant's bits (`bits_of_the_first`: equal where only the warps, stages or register cap differ); `kernels_s`
times the tiles alone on rotated rows (the rate figures use it), `s` the whole call with the rotation; `rotation`
times torch's rotation against `rotate_rows` (one kernel a row) and checks their bits equal. The scratch path
(`exl3_scratch`: the weight decoded once a call into fp16, then tensor-core tiles; the linears' path) is timed the
same way for each of SCRATCH_VARIANTS at 256 and 2,048 rows, beside the tiles' default at both, with its decode
alone (`decode_s`, `decode_gweights_s`: weights decoded a second, each once) and its product alone by difference
(`product_tflops`: 2 x rows x k x n over the kernels' time less the decode's). Beside it:
`exl3_gemm` (the decode path's <=16-row kernel) at 16 rows, whose decode rate is the bar a tile decode should
reach, and torch's bf16 product of the same shape. (That 16-row figure is eager, one call at a time: its host
launch work is in it, so it is not the kernel's graphed rate of kernels.md.) `--ncu` runs the tiles' default
three times and nothing else, for `h200_serving.sh rowsncu`.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import compiled_stats, ensure_tfc

ensure_tfc()

import torch  # noqa: E402
from decode_h200 import timed  # noqa: E402

SHAPES = {
    "k4096_n4096_2bit": (4096, 4096, 2),
    "k4096_n4096_3bit": (4096, 4096, 3),
    "k4096_n16384_6bit": (4096, 16384, 6),
}
# the tiles' launch: (rows a tile, warps, k rows a step, stages, register cap); the first is the default
TILE_VARIANTS = {
    "bm64_w4_k64_s1_cap168": (64, 4, 64, 1, 168), "bm64_w4_k64_s1": (64, 4, 64, 1, None),
    "bm64_w4_k32_s1": (64, 4, 32, 1, None), "bm64_w8_k32_s1": (64, 8, 32, 1, None),
    "bm64_w4_k32_s2": (64, 4, 32, 2, None), "bm32_w4_k32_s1": (32, 4, 32, 1, None),
    "cap128_bm64_w4_k64_s1": (64, 4, 64, 1, 128), "bm64_w8_k64_s1": (64, 8, 64, 1, None),
}  # fmt: skip
# the scratch path: (rows a tile, product warps, product stages, tile rows a decode step, decode warps)
SCRATCH_VARIANTS = {
    "scratch_bm64_w4_s3_t2_d4": (64, 4, 3, 2, 4), "scratch_bm128_w8_s3_t2_d4": (128, 8, 3, 2, 4),
    "scratch_bm64_w4_s3_t1_d2": (64, 4, 3, 1, 2), "scratch_bm64_w4_s3_t4_d4": (64, 4, 3, 4, 4),
}  # fmt: skip
ROWS = 256
ROW_COUNTS = (256, 2048)  # rows the scratch variants and the tile default are timed at
MUL1 = 2


def tile_config(variant: tuple):
    """The RowsConfig of a TILE_VARIANTS entry."""
    from tfc.kernels.exl3.rows import RowsConfig

    bm, warps, bk, stages, cap = variant
    return RowsConfig(block_m=bm, num_warps=warps, block_k=bk, num_stages=stages, max_regs=cap)


def scratch_config(variant: tuple):
    """The RowsConfig of a SCRATCH_VARIANTS entry."""
    from tfc.kernels.exl3.rows import RowsConfig
    from tfc.kernels.exl3.scratch import ScratchConfig

    bm, warps, stages, tile_rows, decode_warps = variant
    scratch = ScratchConfig(
        num_warps=warps, num_stages=stages, tile_rows=tile_rows, decode_warps=decode_warps
    )
    return RowsConfig(block_m=bm, scratch=scratch)


def group(k: int, n: int, bits: int, gen: torch.Generator):
    width = 16 * bits
    trellis = torch.randint(-(2**15), 2**15, (k // 16, n // 16, width), dtype=torch.int32, device="cuda",
                            generator=gen).to(torch.int16)  # fmt: skip
    suh = (torch.randint(0, 2, (k,), device="cuda", generator=gen) * 2 - 1).half()
    svh = (torch.rand(n, device="cuda", generator=gen) * 0.02 + 0.01).half()
    return trellis, suh, svh


def product(x, trellis, suh, svh, config, scratch: bool, rotated=None):
    """The many-row product of x on the tiles or (scratch) through the decoded scratch, with this config; rotated:
    rotate_rows(x, suh) given (the kernels alone)."""
    from tfc.kernels.exl3 import rows as exl3_rows

    n, width = 16 * trellis.shape[1], trellis.shape[2]
    one = torch.zeros(1, dtype=torch.int64, device="cuda")
    return exl3_rows.launch_rows(
        rotated or exl3_rows.rotate_rows(x, suh), trellis.contiguous().view(torch.int32).reshape(-1), one,
        one.int() + width, one.int() + MUL1, svh, exl3_rows.dense_tiles(x.shape[0], x.device, config.block_m), n,
        (width,), MUL1, torch.empty(x.shape[0], n, device="cuda"), scratch=scratch, config=config,
    )  # fmt: skip


def measure(name: str, k: int, n: int, bits: int, gen: torch.Generator) -> dict:
    """One group's row: torch's bf16 product, the 16-row kernel, every tile variant, the compiled kernels."""
    from tfc.kernels.exl3 import rows as exl3_rows
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.gemv import exl3_gemm
    from tfc.kernels.exl3.rotate import fwht128_rows, rows_seen, scaled_fp16

    trellis, suh, svh = group(k, n, bits, gen)
    dense = exl3_decode(trellis, suh, svh, MUL1, dtype=torch.float32)
    x = torch.randn(ROWS, k, device="cuda", generator=gen)
    want = rows_seen(x, suh).double() @ dense.double()
    flops = 2 * ROWS * k * n
    bf, xb = dense.bfloat16(), x.bfloat16()
    row: dict = {"bf16_torch_tflops": flops / timed(lambda: xb @ bf) / 1e12}
    x16 = x[:16].contiguous()
    t16 = timed(lambda: exl3_gemm(x16, trellis, suh, svh, MUL1))
    row["exl3_gemm_16rows"] = {"s": t16, "gweights_s": k * n / t16 / 1e9}

    def torch_rotation():
        return scaled_fp16(fwht128_rows(x.float() * suh.float()))

    rotated = exl3_rows.rotate_rows(x, suh)  # the rotation in one kernel a row, against torch's
    row["rotation"] = {"torch_s": timed(torch_rotation), "kernel_s": timed(lambda: exl3_rows.rotate_rows(x, suh)),
                       "bits_equal": all(torch.equal(a, b) for a, b in zip(torch_rotation(), rotated, strict=True))}  # fmt: skip
    print(name, "rotation", row["rotation"], flush=True)
    first = None
    for vname, variant in TILE_VARIANTS.items():
        config = tile_config(variant)
        try:
            got = product(x, trellis, suh, svh, config, False)
            err = float((got.double() - want).norm() / want.norm())
            t = timed(lambda c=config: product(x, trellis, suh, svh, c, False), reps=10)
            prep = timed(lambda: exl3_rows.rotate_rows(x, suh), reps=10)
            kern = timed(lambda c=config: product(x, trellis, suh, svh, c, False, rotated), reps=10)
            first = got if first is None else first
            row[vname] = {"rel_err": err, "ok": err < 1e-5, "s": t, "rotation_s": prep, "kernels_s": kern,
                          "tflops": flops / t / 1e12, "kernel_tflops": flops / kern / 1e12,
                          "gweights_s": k * n * (-(-ROWS // config.block_m)) / kern / 1e9,
                          "bits_of_the_first": bool(torch.equal(got, first))}  # fmt: skip
        except Exception as exc:  # a variant that does not compile (shared memory, registers) is recorded
            row[vname] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        print(name, vname, {a: (round(b, 6) if isinstance(b, float) else b) for a, b in row[vname].items()},
              flush=True)  # fmt: skip
    row["scratch"] = scratch_paths(trellis, suh, svh, bits, n, k, gen)
    row["compiled"] = compiled_stats(exl3_rows._rows_kernel)
    print(name, "bf16", round(row["bf16_torch_tflops"], 1), "16-row", row["exl3_gemm_16rows"], flush=True)
    return row


def scratch_paths(trellis, suh, svh, bits: int, n: int, k: int, gen: torch.Generator) -> dict:
    """The scratch path's variants and the tiles' default at ROW_COUNTS rows: checked, timed."""
    from tfc.kernels.exl3 import rows as exl3_rows
    from tfc.kernels.exl3 import scratch as exl3_scratch
    from tfc.kernels.exl3.decode import exl3_decode
    from tfc.kernels.exl3.rotate import rows_seen

    dense = exl3_decode(trellis, suh, svh, MUL1, dtype=torch.float32).double()
    words = trellis.contiguous().view(torch.int32).reshape(-1)
    one = torch.zeros(1, dtype=torch.int64, device="cuda")
    widths = torch.full((1,), 16 * bits, dtype=torch.int32, device="cuda")
    want_hat = exl3_decode(trellis, suh, svh, MUL1, rotated=True)
    out: dict = {}
    default_tiles = next(iter(TILE_VARIANTS))
    for rows in ROW_COUNTS:
        x = torch.randn(rows, k, device="cuda", generator=gen)
        want = rows_seen(x, suh).double() @ dense
        rotated = exl3_rows.rotate_rows(x, suh)
        flops = 2 * rows * k * n
        at = out.setdefault(str(rows), {})
        variants = {f"tiles_{default_tiles}": (tile_config(TILE_VARIANTS[default_tiles]), False)}
        variants |= {vname: (scratch_config(v), True) for vname, v in SCRATCH_VARIANTS.items()}
        for vname, (config, scratch) in variants.items():
            try:
                got = product(x, trellis, suh, svh, config, scratch)
                err = float((got.double() - want).norm() / want.norm())
                kern = timed(
                    lambda c=config, s=scratch, r=rotated, x=x: product(x, trellis, suh, svh, c, s, r),
                    reps=10,
                )
                r = {
                    "rel_err": err,
                    "ok": err < 1e-5,
                    "kernels_s": kern,
                    "kernel_tflops": flops / kern / 1e12,
                }
                if scratch:
                    hit = exl3_scratch.entries_with_rows(
                        exl3_rows.dense_tiles(rows, x.device, config.block_m), 1
                    )
                    buf = torch.empty((1, k, n), dtype=torch.float16, device="cuda")
                    dec = timed(lambda hit=hit, buf=buf, c=config.scratch: exl3_scratch.decode_round(
                        words, one, widths, one.int() + MUL1, hit, buf, 0, (16 * bits,), MUL1, c), reps=10)  # fmt: skip
                    r |= {"decode_s": dec, "decode_gweights_s": k * n / dec / 1e9,
                          "decode_exact": bool(torch.equal(buf[0], want_hat)),
                          "product_tflops": flops / max(kern - dec, 1e-9) / 1e12}  # fmt: skip
                at[vname] = r
            except Exception as exc:  # a variant that does not compile (shared memory, registers) is recorded
                at[vname] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            print(rows, vname, {a: (round(b, 6) if isinstance(b, float) else b) for a, b in at[vname].items()},
                  flush=True)  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--ncu", action="store_true",
                    help="only run the tiles' default on the 3-bit group three times (for Nsight Compute)")  # fmt: skip
    ap.add_argument("--variants", default="", help="the tile variants timed, comma-separated (default: all)")
    ap.add_argument("--scratch-variants", default="",
                    help="the scratch variants timed, comma-separated (default: all)")  # fmt: skip
    args = ap.parse_args()
    for arg, table in ((args.variants, TILE_VARIANTS), (args.scratch_variants, SCRATCH_VARIANTS)):
        names = [v for v in arg.split(",") if v]
        if any(v not in table for v in names):
            ap.error(f"variants are {', '.join(table)}; got {arg!r}")
        for v in [v for v in table if names and v not in names]:
            del table[v]
    if args.ncu:
        from tfc.kernels.exl3.rows import RowsConfig

        gen = torch.Generator(device="cuda").manual_seed(0)
        k, n, bits = SHAPES["k4096_n4096_3bit"]
        trellis, suh, svh = group(k, n, bits, gen)
        x = torch.randn(ROWS, k, device="cuda", generator=gen)
        for _ in range(3):
            product(x, trellis, suh, svh, RowsConfig(), False)
        torch.cuda.synchronize()
        return
    gen = torch.Generator(device="cuda").manual_seed(0)
    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
                 "rows": ROWS, "shapes": {}}  # fmt: skip
    for name, (k, n, bits) in SHAPES.items():
        res["shapes"][name] = measure(name, k, n, bits, gen)
        Path(args.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
