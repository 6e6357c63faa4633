#!/usr/bin/env bash
# One H200 session for the tensor-parallel fast forward: the fixed-point / pinned-share kernel tests at Flash
# shapes, then benchmarks/tp_fast_h200.py (TP=N = TP=1 on the tiny pack through the kernels, the exact products'
# cost on a Flash slice). Everything runs from /tmp, so `tfc` is the installed package, not the checkout's folder.
# Run on the device from the repository root with .whl carried:   bash benchmarks/h200_tp.sh [--no-tests]
source benchmarks/_h200_setup.sh
REPO=$PWD
cd /tmp
if [ "${1:-}" != "--no-tests" ]; then
  echo "== kernel tests"; timeout 200 python3 -m pytest -q -p no:cacheprovider \
      "$REPO/tests/kernels/test_kernels_fixed_gpu.py" 2>&1 | tail -15 | tee "$OUT/tp_gpu_tests.txt"
fi
echo "== tp_fast_h200"; timeout 500 python3 "$REPO/benchmarks/tp_fast_h200.py" --out "$OUT/tp_fast_h200.json" \
    --work "$WORK/tp" --budget-s 420 ${TP_ONLY:+--only $TP_ONLY} 2>&1 | tail -8
rm -rf "$WORK/tp"
