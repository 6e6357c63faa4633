#!/usr/bin/env bash
# One H200 session for the tensor-parallel fast forward: the fixed-point / pinned-share kernel tests at Flash
# shapes, the fast-forward GPU tests (TP=1 unchanged), then benchmarks/tp_fast_h200.py (TP=N = TP=1 on the tiny
# pack through the kernels, the exact products' cost on a Flash slice).
# Run on the device from the repository root with .whl carried:   bash benchmarks/h200_tp.sh
source benchmarks/_h200_setup.sh
REPO=$PWD
echo "== kernel tests"; (cd /tmp && timeout 200 python3 -m pytest -q -p no:cacheprovider \
    "$REPO/tests/kernels/test_kernels_fixed_gpu.py" "$REPO/tests/runtime/models/dsv41/test_fast_gpu.py") 2>&1 \
    | tail -15 | tee "$OUT/tp_gpu_tests.txt"
echo "== tp_fast_h200"; timeout 420 python3 benchmarks/tp_fast_h200.py --out "$OUT/tp_fast_h200.json" --work "$WORK/tp" 2>&1 | tail -8
rm -rf "$WORK/tp"
