#!/usr/bin/env python3
"""What a restart imports for the fast forward's small-op stages: torch.compile's stack (the compiled stages) against
the stage kernels' modules (TFC_STAGE_KERNELS=1), each in fresh processes after `import torch`.

    python benchmarks/stage_imports.py --reps 5 --out benchmarks/results/serve/stage_imports_cpu_run1.json

Each figure is the median wall time of the import in a new interpreter (torch already imported there, as a boot
has it): the compiled stages' boot imports `torch._dynamo` and `torch._inductor.compile_fx` (warm_imports.py)
before it loads its saved stages; the stage kernels' boot imports tfc.kernels' four stage modules (triton with
them). The kernels' first launches (Triton's cache read, launcher load) are not in it: those need a GPU.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
from pathlib import Path

IMPORTS = {
    "compiled_stages": "import torch._dynamo, torch._inductor.compile_fx",
    "stage_kernels": "import tfc.kernels.dsv41.kv_pack, tfc.kernels.dsv41.attend_rows, tfc.kernels.dsv41.mhc_stages, tfc.kernels.dsv41.router_pick",
}
PROBE = "import time, torch\nt = time.perf_counter()\n{}\nprint(time.perf_counter() - t)"


def once(statement: str) -> float:
    """Seconds of `statement` in a fresh interpreter that has imported torch."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(statement)], capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="fresh processes per import, interleaved")
    ap.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = ap.parse_args()
    runs: dict[str, list[float]] = {name: [] for name in IMPORTS}
    for _ in range(args.reps):
        for name, statement in IMPORTS.items():
            runs[name].append(once(statement))
    import torch

    res = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
           "imports": IMPORTS, "seconds": runs, "median_s": {k: statistics.median(v) for k, v in runs.items()}}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(json.dumps(res["median_s"]))


if __name__ == "__main__":
    main()
