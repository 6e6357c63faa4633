#!/usr/bin/env bash
# One H200 call for the runtime questions: the GPU tests (uploads, forward; the kernel GPU tests run with
# the kernel benchmark), a 22 GB Flash-geometry image, then the boot benchmark. From the repository root,
# with .whl carried (blake3 for python 3.12):  bash benchmarks/h200_boot.sh
# SKIP_TESTS=1 skips the GPU tests (the kernel ones too); PIPELINE_S=N first runs boot_pipeline_h200.py for N seconds;
# BOOT_S=N gives boot_h200.py N seconds (0 skips it); BOOT_ARGS are its options (default --reps 2);
# KERNELS_S=N first runs the GPU kernel tests (only those matching KERNEL_TESTS_K when set, pytest -k) and
# kernels_h200.py $KERNEL_ARGS for at most N seconds;
# L3_S=N runs boot_l3_h200.py (cache-resident staging) for N seconds before the boot benchmark.
source benchmarks/_h200_setup.sh
TFC="python3 -c 'import sys; from tfc.cli import main; sys.argv[0] = \"tfc\"; main()'"
REPO=$PWD
echo "== gpu tests"
[ -n "${SKIP_TESTS:-}" ] || (cd /tmp && timeout 100 python3 -m pytest -q -m gpu -p no:cacheprovider --ignore="$REPO/tests/kernels/test_kernels_gpu.py" \
  "$REPO/tests") 2>&1 | tail -15 | tee "$OUT/gpu_tests.txt"
if [ "${KERNELS_S:-0}" -gt 0 ]; then
  echo "== kernel gpu tests"
  [ -n "${SKIP_TESTS:-}" ] || (cd /tmp && timeout 240 python3 -m pytest -q -p no:cacheprovider ${KERNEL_TESTS_K:+-k "$KERNEL_TESTS_K"} \
    "$REPO/tests/kernels/test_kernels_gpu.py") 2>&1 | tail -8 | tee "$OUT/kernel_gpu_tests.txt"
  echo "== kernels"
  timeout "$KERNELS_S" python3 benchmarks/kernels_h200.py --out "$OUT" ${KERNEL_ARGS:-} 2>&1 | tee "$OUT/kernels_log.txt" \
    | tail -60
fi
BOOT_S=${BOOT_S:-160}
[ "$BOOT_S" -gt 0 ] || [ "${PIPELINE_S:-0}" -gt 0 ] || [ "${L3_S:-0}" -gt 0 ] || exit 0  # nothing needs the image
echo "== image"
T0=$(date +%s)
(cd /tmp && eval "$TFC fixture flash-random $WORK/pack --jobs 16" >/dev/null && eval "$TFC prepare $WORK/pack -o $WORK/store" \
  | tail -2)
echo "image made in $(( $(date +%s) - T0 )) s"
rm -rf "$WORK/pack"
IMG=$(ls -d "$WORK"/store/*/rank0 2>/dev/null | head -1)
if [ -n "$IMG" ] && [ "${PIPELINE_S:-0}" -gt 0 ]; then
  echo "== boot pipeline ($IMG)"
  (lscpu | grep -iE "model name|cache|numa|socket"; /lib64/ld-linux-x86-64.so.2 --list-tunables 2>/dev/null \
    | grep -iE "non_temporal|rep_movsb") | tee "$OUT/cpu.txt"
  timeout $(( PIPELINE_S + 40 )) python3 benchmarks/boot_pipeline_h200.py --image "$IMG" --out "$OUT" \
    --budget-s "$PIPELINE_S" 2>&1 | tee "$OUT/boot_pipeline_log.txt" | tail -30
  if [ -n "${NT_THRESHOLD:-}" ]; then  # the same copies with glibc's non-temporal stores from NT_THRESHOLD bytes
    echo "== boot pipeline, GLIBC_TUNABLES non-temporal threshold $NT_THRESHOLD"
    GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=$NT_THRESHOLD timeout 100 python3 \
      benchmarks/boot_pipeline_h200.py --image "$IMG" --out "$OUT" --budget-s 60 --plan short 2>&1 \
      | tee "$OUT/boot_pipeline_nt_log.txt" | tail -12
  fi
fi
if [ -n "$IMG" ] && [ "${L3_S:-0}" -gt 0 ]; then
  echo "== cache-resident staging ($IMG)"
  timeout $(( L3_S + 40 )) python3 benchmarks/boot_l3_h200.py --image "$IMG" --out "$OUT" --budget-s "$L3_S" 2>&1 \
    | tee "$OUT/boot_l3_log.txt" | tail -20
fi
if [ -n "$IMG" ] && [ "$BOOT_S" -gt 0 ]; then
  echo "== boot ($IMG)"
  timeout $(( BOOT_S + 30 )) python3 benchmarks/boot_h200.py --image "$IMG" --out "$OUT" ${BOOT_ARGS:---reps 2} --budget-s "$BOOT_S" \
    2>&1 | tail -40
fi
rm -rf "$WORK"
