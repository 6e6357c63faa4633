#!/usr/bin/env bash
# One H200 session for the image questions: GPU tests, prepare vs copy, verify vs read, boot, Engram gather.
# Run on the device from the repository root with .whl carried (blake3 for python 3.12):
#   bash benchmarks/h200_all.sh
source benchmarks/_h200_setup.sh
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/gpu.txt"
df -h "$WORK" | tail -1 | tee -a "$OUT/gpu.txt"
echo "== gpu tests"; REPO=$PWD; (cd /tmp && timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider "$REPO/tests") 2>&1 | tail -25 | tee "$OUT/gpu_tests.txt"
echo "== engram gather"; timeout 90 python3 benchmarks/engram_gather_h200.py 2>&1 | tail -12; cp benchmarks/results/engram/engram_gather_h200.json "$OUT/" 2>/dev/null
echo "== prepare/verify"; timeout 300 python3 benchmarks/prepare_bench.py --work "$WORK" --make-layers 4 --keep-image --out "$OUT" 2>&1 | tail -14
rm -rf "$WORK/pack"
IMG=$(ls -d "$WORK"/store/*/rank0 2>/dev/null | head -1)
echo "== boot ($IMG)"; [ -n "$IMG" ] && timeout 240 python3 benchmarks/boot_h200.py --image "$IMG" --out "$OUT" --reps 3 2>&1 | tail -16
rm -rf "$WORK"
