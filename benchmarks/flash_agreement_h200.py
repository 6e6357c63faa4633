#!/usr/bin/env python3
"""The Flash slice's layers against the reference on device-decoded weights (`dense_check.image_agreement`, the check of
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench_env import ensure_tfc

ensure_tfc()

import torch  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    args = ap.parse_args()
    from support.dense_check import image_agreement
    from tfc.kernels.dsv41 import attend_keys

    res: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "modes": {}}
    for mode, gather in (("gather", True), ("runs", False)):
        attend_keys.GATHER = gather
        res["modes"][mode] = image_agreement(os.environ["TFC_FLASH_IMAGE"])  # test_fast_gpu's tokens
        print(mode, json.dumps(res["modes"][mode]), flush=True)
    res["same_errors"] = res["modes"]["gather"] == res["modes"]["runs"]
    Path(args.out).write_text(json.dumps(res, indent=1))
    print("same errors:", res["same_errors"])


if __name__ == "__main__":
    main()
