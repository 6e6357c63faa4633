"""Benchmark: what a fresh process's first page-lock of prefaulted staging costs, by binding (H200 host).

    python3 benchmarks/register_first_h200.py [--mib 128] [--reps 3]

Each case runs in a fresh process: import torch, start CUDA on device 0 (both untimed), map and fault in
`--mib` of anonymous memory (untimed), then time importing the binding, the first cudaHostRegister of the
region, its unregister, and a second register of the same pages. Bindings: cuda-python's runtime module,
torch's cudart, and libcuda's cuMemHostRegister_v2 through ctypes. Prints one JSON line per process.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

CHILD = r"""
import ctypes, json, mmap, sys, time
import torch
torch.cuda.init(); torch.empty(1, device="cuda"); torch.cuda.synchronize()
kind, nbytes = sys.argv[1], int(sys.argv[2])
buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | mmap.MAP_POPULATE)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
t0 = time.perf_counter()
if kind == "cuda-python":
    from cuda.bindings import runtime as rt
    reg = lambda: rt.cudaHostRegister(addr, nbytes, 1)[0]
    unreg = lambda: rt.cudaHostUnregister(addr)
elif kind == "torch":
    rt = torch.cuda.cudart()
    reg = lambda: rt.cudaHostRegister(addr, nbytes, 1)
    unreg = lambda: rt.cudaHostUnregister(addr)
else:
    cu = ctypes.CDLL("libcuda.so.1")
    reg = lambda: cu.cuMemHostRegister_v2(ctypes.c_void_p(addr), ctypes.c_size_t(nbytes), 1)
    unreg = lambda: cu.cuMemHostUnregister(ctypes.c_void_p(addr))
t1 = time.perf_counter(); e1 = reg(); t2 = time.perf_counter(); unreg(); t3 = time.perf_counter()
e2 = reg(); t4 = time.perf_counter(); unreg()
print(json.dumps({"binding": kind, "mib": nbytes >> 20, "import_s": round(t1 - t0, 4), "first_s": round(t2 - t1, 4),
                  "unregister_s": round(t3 - t2, 4), "second_s": round(t4 - t3, 4), "errors": [str(e1), str(e2)]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    for _ in range(args.reps):
        for kind in ("cuda-python", "torch", "libcuda"):
            done = subprocess.run([sys.executable, "-c", CHILD, kind, str(args.mib << 20)], capture_output=True,
                                  text=True, check=False)  # fmt: skip
            print(done.stdout.strip() or json.dumps({"binding": kind, "error": done.stderr.strip()[-300:]}))


if __name__ == "__main__":
    main()
