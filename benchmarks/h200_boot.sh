#!/usr/bin/env bash
# One H200 call for the runtime questions: the GPU tests (uploads, forward; the kernel GPU tests run with
# the kernel benchmark), a 22 GB Flash-geometry image, then the boot benchmark. From the repository root,
# with .whl carried (blake3 for python 3.12):  bash benchmarks/h200_boot.sh
source benchmarks/_h200_setup.sh
TFC="python3 -c 'import sys; from tfc.cli import main; sys.argv[0] = \"tfc\"; main()'"
REPO=$PWD
echo "== gpu tests"
[ -n "${SKIP_TESTS:-}" ] || (cd /tmp && timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider --ignore="$REPO/tests/test_kernels_gpu.py" \
  "$REPO/tests") 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
echo "== image"
T0=$(date +%s)
(cd /tmp && eval "$TFC fixture flash-random $WORK/pack --jobs 16" >/dev/null && eval "$TFC prepare $WORK/pack -o $WORK/store" \
  | tail -2)
echo "image made in $(( $(date +%s) - T0 )) s"
rm -rf "$WORK/pack"
IMG=$(ls -d "$WORK"/store/*/rank0 2>/dev/null | head -1)
echo "== boot ($IMG)"
[ -n "$IMG" ] && timeout 190 python3 benchmarks/boot_h200.py --image "$IMG" --out "$OUT" --reps 2 --budget-s 160 \
  2>&1 | tail -40
rm -rf "$WORK"
