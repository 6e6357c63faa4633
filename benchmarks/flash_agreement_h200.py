#!/usr/bin/env python3
"""The Flash slice's layers against the reference on device-decoded weights (`dense_check.agreement`, the check of
test_fast_gpu's `test_flash_slice_layers_match_the_reference_on_device_decoded_weights`), once with each way
`attend_rows` reads its keys below a prefill step's rows: gathered per row first (attend_keys.GATHER, the
default) and decoded in the runs. The same keys, so both must give the same errors to the last digit.

    TFC_FLASH_IMAGE=<slice rank0> python3 benchmarks/flash_agreement_h200.py --out $OUT/flash_agreement.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import ensure_tfc

ensure_tfc()

import torch  # noqa: E402

TOKENS = [0, 17, 4242, 99, 123, 5000, 77, 31000]  # test_fast_gpu.FLASH_TOKENS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args()
    from tfc.kernels import attend_keys
    from tfc.runtime.boot.rank import boot
    from tfc.runtime.graphs.graph_cache import GraphCache, GraphSettings
    from tfc.runtime.models.dsv41.fast.build import build_fast
    from tfc.runtime.models.dsv41.fast.dense_check import agreement

    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "modes": {}}
    for mode, gather in (("gather", True), ("runs", False)):
        attend_keys.GATHER = gather
        booted = boot(os.environ["TFC_FLASH_IMAGE"], device="cuda")
        try:
            fast = build_fast(booted, slots=1, tokens_per_slot=4096, engram=False)
            own = SimpleNamespace(image=booted.image, arena=booted.arena, graphs=GraphCache(GraphSettings()))
            loose = build_fast(own, slots=1, tokens_per_slot=4096, exact=False, engram=False)
            res["modes"][mode] = agreement(fast, loose, TOKENS)
        finally:
            booted.close()
        print(mode, json.dumps(res["modes"][mode]), flush=True)
    res["same_errors"] = res["modes"]["gather"] == res["modes"]["runs"]
    Path(args.out).write_text(json.dumps(res, indent=1))
    print("same errors:", res["same_errors"])


if __name__ == "__main__":
    main()
