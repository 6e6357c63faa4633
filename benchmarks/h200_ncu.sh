#!/usr/bin/env bash
# Nsight Compute on the EXL3 kernels at Flash shapes: pipe, issue and stall figures per workload, and an opcode
# histogram of each compiled kernel's SASS. From the repository root: bash benchmarks/h200_ncu.sh [WORKLOAD ...]
source benchmarks/_h200_setup.sh
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
echo "ncu: $NCU" | tee "$OUT/ncu_env.txt"
"$NCU" --version | tee -a "$OUT/ncu_env.txt"
cd benchmarks
WL=${*:-$(python3 -c 'import kernels_ncu_h200 as k; print(" ".join(k.WORKLOADS))')}
for w in $WL; do
  echo "== $w"
  export TRITON_CACHE_DIR=/tmp/tc_$w; rm -rf "$TRITON_CACHE_DIR"
  timeout 240 "$NCU" --clock-control none -k regex:'exl3_gemm|moe_gate_up|moe_down' --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
    --section Occupancy --section LaunchStats --section InstructionStats --print-details all \
    python3 kernels_ncu_h200.py "$w" > "$OUT/ncu_$w.txt" 2>&1
  grep -E "Duration|Issue Slots Busy|Executed Ipc Active|Registers Per|Achieved Occupancy|Theoretical Occ|highest-utilized|Stall|stalled|Pipe|Warp Cycles Per Issued|Eligible Warps|No Eligible|SM Frequency|Memory Throughput|DRAM Throughput" \
    "$OUT/ncu_$w.txt" | head -40
  for c in $(find "$TRITON_CACHE_DIR" -name '*.cubin' | grep -E 'exl3_gemm|moe_gate_up|moe_down'); do
    echo "-- $(basename "$c") opcodes" >> "$OUT/sass_hist.txt"
    cuobjdump -sass "$c" | grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_.]+' | awk '{print $NF}' \
      | sed 's/\..*//' | sort | uniq -c | sort -rn | head -25 >> "$OUT/sass_hist.txt"
  done
done
tail -c 3000 "$OUT/sass_hist.txt"
