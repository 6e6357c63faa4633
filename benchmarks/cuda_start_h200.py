"""Benchmark: where a fresh process's CUDA start goes before an upload, and whether starting it early helps.

    python3 benchmarks/cuda_start_h200.py [--gib 22] [--reps 3]

Each case is a fresh process that imports torch and then times: the CUDA context (torch.empty(1) on the
device) and the arena's allocation (`--gib` GiB in 1 GiB tensors, as runtime/boot/arena.py allocates). Case
`early`: a thread calls libcuda's cuInit and cuDevicePrimaryCtxRetain (the context torch's runtime uses)
before `import torch`, so the context is made while torch imports. Prints one JSON line per process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import ctypes, json, sys, threading, time
t0 = time.perf_counter()
early, gib = sys.argv[1] == "early", int(sys.argv[2])
def start():
    cu = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    cu.cuInit(0); cu.cuDeviceGet(ctypes.byref(dev), 0); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
th = threading.Thread(target=start)
if early:
    th.start()
import torch
t1 = time.perf_counter()
if early:
    th.join()
t2 = time.perf_counter()
torch.empty(1, device="cuda"); torch.cuda.synchronize()
t3 = time.perf_counter()
arena = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(gib)]; torch.cuda.synchronize()
t4 = time.perf_counter()
print(json.dumps({"case": sys.argv[1], "import_s": round(t1 - t0, 3), "join_s": round(t2 - t1, 4),
                  "context_s": round(t3 - t2, 4), "alloc_s": round(t4 - t3, 4), "gib": gib}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gib", type=int, default=22)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    for _ in range(args.reps):
        for case in ("lazy", "early"):
            done = subprocess.run([sys.executable, "-c", CHILD, case, str(args.gib)], capture_output=True, text=True,
                                  check=False)  # fmt: skip
            print(done.stdout.strip() or json.dumps({"case": case, "error": done.stderr.strip()[-300:]}))


if __name__ == "__main__":
    main()
