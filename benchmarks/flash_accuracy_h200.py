#!/usr/bin/env python3
"""How far the fast forward is from the reference on the Flash slice, against the noise its bf16 activations
alone make, and where a 1-row and a 16-row step spend their GPU time.

Run on the GPU machine from the repository root, after `source benchmarks/_h200_setup.sh`:
    python3 benchmarks/flash_accuracy_h200.py --image IMG/rank0 --out $OUT/flash_accuracy.json
Parts (the JSON is rewritten after each):
  layers    every layer's streams and the logits of 8 tokens: the fast forward (pinned launches) and the fast
            forward with each shape's own launches ("loose": the same bf16 maths in another summation order)
            against the reference in fp32 on the device-decoded weights, and the loose against the pinned: when
            fast-vs-loose is as large as fast-vs-reference, the gap is bf16 noise that the random weights
            amplify layer by layer, not a wrong op
  router    layer 0's router product on random rows: aten::mm.dtype on the arena view and on a copy, the fp32
            product, and the three-part split the forward uses, each against fp64
  profile   torch.profiler over eager steps at 1 and 16 rows: GPU time by kernel name, the top 30
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import Parts, ensure_tfc

ensure_tfc()

import torch  # noqa: E402

DEV = torch.device("cuda")
TOKENS = [0, 17, 4242, 99, 123, 5000, 77, 31000]


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).abs().max() / want.double().abs().max())


def main() -> None:
    from support.dense_check import agreement
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.graphs.graph_cache import GraphCache, GraphSettings
    from tfc.runtime.models.dsv41.fast.build import build_fast

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    res: dict = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tokens": TOKENS,
        "parts": {},
    }
    part = Parts(res, Path(args.out))

    booted = boot(args.image, device="cuda")
    fast = build_fast(booted, slots=16, tokens_per_slot=8192, engram=False)
    loose = build_fast(SimpleNamespace(image=booted.image, arena=booted.arena, graphs=GraphCache(GraphSettings())),
                       slots=16, tokens_per_slot=8192, exact=False, engram=False)  # fmt: skip
    res["notes"] = list(fast.stats()["notes"])

    def layers():
        res["layers"] = agreement(fast, loose, TOKENS)

    def router():
        from tfc.runtime.models.dsv41.fast.moe import split3

        w, ops = fast.forward.weights, fast.forward.ops
        gate = w.native("layers.0.ffn.gate.weight")
        gen = torch.Generator(device=DEV).manual_seed(0)
        x = torch.randn(16, gate.shape[1], device=DEV, generator=gen)
        want = x.double() @ gate.double().T
        parts = split3(x, gate.dtype)
        rows = x.shape[0]

        def summed(p):
            return (p[:rows] + p[rows : 2 * rows]) + p[2 * rows :]

        res["router"] = {
            "dtype": str(gate.dtype), "shape": list(gate.shape), "stride": list(gate.stride()),
            "mm_dtype_flag": bool(ops._mm_dtype),
            "split_reconstructs_x": rel(summed(parts.float()), x),
            "split_mm_dtype_view": rel(summed(torch.ops.aten.mm.dtype(parts, gate.t(), torch.float32)), want),
            "split_mm_dtype_copy": rel(summed(torch.ops.aten.mm.dtype(parts, gate.clone().t(), torch.float32)), want),
            "split_fp32": rel(summed(parts.float() @ gate.float().t()), want),
            "fp32_direct": rel(x @ gate.float().t(), want),
            "ops_mm_bf16": rel(summed(ops.mm_bf16(parts, gate)), want),
            "hi_only_mm_dtype": rel(torch.ops.aten.mm.dtype(parts[:rows], gate.t(), torch.float32),
                                    parts[:rows].double() @ gate.double().T),
        }  # fmt: skip

    def profile():
        from torch.profiler import ProfilerActivity
        from torch.profiler import profile as prof

        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from decode_h200 import decode_tile

        res["profile"] = {}
        for rows in (1, 16):
            tile = decode_tile(fast, rows)
            fast.launch(tile)
            for _ in range(3):
                fast.forward.step(tile.key)
            torch.cuda.synchronize()
            steps = 5
            with prof(activities=[ProfilerActivity.CUDA]) as p:
                for _ in range(steps):
                    fast.forward.step(tile.key)
                torch.cuda.synchronize()
            events = [e for e in p.key_averages() if e.device_time_total > 0]
            events.sort(key=lambda e: -e.device_time_total)
            total = sum(e.device_time_total for e in events)
            res["profile"][rows] = {
                "gpu_us_per_step": total / steps,
                "kernels_per_step": sum(e.count for e in events) / steps,
                "top": [{"name": e.key[:120], "us_per_step": e.device_time_total / steps, "calls": e.count / steps}
                        for e in events[:30]],
            }  # fmt: skip

    part("layers", layers)
    torch.cuda.empty_cache()
    part("router", router)
    part("profile", profile)
    part.save()


if __name__ == "__main__":
    main()
