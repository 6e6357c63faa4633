#!/usr/bin/env bash
# The H200 checks of the serving half (setup first, ~30 s; the 22 GB Flash slice, ~90 s, made once for the parts
# that use it). Run from the repository root with .whl carried:
#   bash benchmarks/h200_serving.sh tests     # the Sinkhorn kernel's, the sampler's, HostStage's GPU tests, test_fast_gpu.py's tiny-image ones (#19)
#   bash benchmarks/h200_serving.sh servetests  # tfc serve's prefix-cache tests on the GPU (tiny image, fast forward, #25)
#   bash benchmarks/h200_serving.sh drafttests  # drafting on the fast forward: runner, engine, tfc generate, tfc serve (#24)
#   bash benchmarks/h200_serving.sh prefill   # prefill_h200.py: the many-row kernels and the prefill forward on the slice (#19)
#                                             # (TFC_PREFILL_ARGS="--only prefill --prompts 2048 --widths 256" a short run)
#   bash benchmarks/h200_serving.sh rowstests   # the many-row kernels' GPU tests and the PTX decode's (#19)
#   bash benchmarks/h200_serving.sh pdl         # pdl_chain_h200.py: programmatic dependent launch on a graphed kernel chain (#19)
#   bash benchmarks/h200_serving.sh moetiles    # the prefill MoE's tiles alone at Flash's shapes (tilesncu: under ncu) (#19)
#   bash benchmarks/h200_serving.sh rowskernel  # rows_kernel_h200.py: exl3_rows' launch variants on synthetic groups (#19)
#                                             (TFC_ROWS_ARGS="--variants a,b --scratch-variants c": fewer variants)
#   bash benchmarks/h200_serving.sh attendrows  # attend_rows_h200.py: the attention kernel's products on the matrix units against FMA (#19)
#   bash benchmarks/h200_serving.sh attendncu   # Nsight Compute on that kernel's first launch at 2,048 rows (#19)
#   bash benchmarks/h200_serving.sh rowsncu     # Nsight Compute on that kernel: stalls, pipes, its SASS opcodes (#19)
#   bash benchmarks/h200_serving.sh scratchncu  # Nsight Compute on the prefill's scratch decode (scratch_decode_ncu.py, #19)
#   bash benchmarks/h200_serving.sh prefilltests  # test_fast_prefill.py on the GPU (tiny image, graphs on, #19)
#   bash benchmarks/h200_serving.sh drafting  # decode_h200's decode, verify windows and DSpark drafter on the slice (#24)
#   bash benchmarks/h200_serving.sh flashagree  # flash_agreement_h200.py: the slice's layers against the reference, each keys mode (#19)
#   bash benchmarks/h200_serving.sh flashtests  # test_fast_gpu.py's two Flash-slice tests (#19)
#   bash benchmarks/h200_serving.sh decode    # decode_h200's checks and decode steps only (#19)
#   bash benchmarks/h200_serving.sh stages    # the stage kernels' GPU tests, then each stage as written / as its kernel (stages_h200.py)
#   bash benchmarks/h200_serving.sh grouped   # the grouped / live-row / skipping kernels' GPU tests and the tiny image's exactness tests (#19)
#   bash benchmarks/h200_serving.sh variants  # step_variants_h200.py: the decode step against variants of itself (STEP_VARIANTS, #19)
#   bash benchmarks/h200_serving.sh stagetests   # test_fast_gpu.py's exactness tests on the tiny image
#   bash benchmarks/h200_serving.sh speed     # sampling.py, decode_h200 (decode, verify windows, prefill 2k) (#19, #24)
#   bash benchmarks/h200_serving.sh serve     # tfc serve on the slice: overhead, start-to-ready, restarts (#20)
#   bash benchmarks/h200_serving.sh prefix    # the prefix cache at 16k tokens: TTFT, host-tier restore (#25)
#   bash benchmarks/h200_serving.sh restore   # its host-tier restore alone (#25)
#   bash benchmarks/h200_serving.sh parallel  # TP=2 boot on this host's 16 cores (parallel_cpu.py, #22)
#   bash benchmarks/h200_serving.sh serveprof # tfc serve's restarts on the slice, the boot thread and main thread profiled (#20)
#                                             (TFC_SERVEPROF_ARGS="--starts 4 --profile 0": restarts only, none profiled)
#   bash benchmarks/h200_serving.sh bootprof  # tfc load twice, the restart under cProfile (start-to-ready, #20)
#   bash benchmarks/h200_serving.sh sampling  # the sampler's time a token, logits on the CPU and on the GPU
#   TFC_H200_TESTS="tests/a.py::t tests/b.py::u" bash benchmarks/h200_serving.sh retests  # those tests, short tracebacks
#                                                 # (TFC_H200_TESTS_S seconds, default 150)
# Several parts run in turn (`... speed prefix`); every part has its own time limit; what it wrote lands under $OUT.
set -u
source benchmarks/_h200_setup.sh > "$OUT/setup.log" 2>&1
R=$PWD
IMG=
slice() {  # the 22 GB Flash slice, made once a machine, for the parts that use it (~90 s)
  [ -n "$IMG" ] && return
  ls -d "$WORK"/store/*/rank0 > /dev/null 2>&1 || \
  (cd /tmp && timeout 150 python3 -m tfc fixture flash-random "$WORK/pack" --layers 4 --jobs 16 \
    && timeout 120 python3 -m tfc prepare "$WORK/pack" --store "$WORK/store" && rm -rf "$WORK/pack") > "$OUT/image.log" 2>&1
  IMG=$(ls -d "$WORK"/store/*/ | head -1)rank0
}
for PART in "${@:-tests}"; do
case "$PART" in
  tests|sampling|servetests|drafttests|parallel|prefilltests|rowstests|rowskernel|pdl|moetiles|tilesncu|attendrows|attendncu|rowsncu|scratchncu|stagetests|grouped) ;;
  *) slice ;;
esac
case "$PART" in
  retests)  # the pytest ids of TFC_H200_TESTS, tracebacks short
    (cd /tmp && TFC_INSTANT_FAILURES=1 TFC_FLASH_IMAGE=$IMG timeout "${TFC_H200_TESTS_S:-150}" python3 -m pytest -q -p no:cacheprovider \
      -p no:warnings --tb=short -rA $(for t in ${TFC_H200_TESTS:-}; do echo "$R/$t"; done)) > "$OUT/retests.txt" 2>&1
    tail -40 "$OUT/retests.txt" ;;
  sampling)
    timeout 60 python3 benchmarks/sampling.py --out "$OUT/sampling_h200.json" 2>&1 | tail -4 ;;
  tests)  # the tiny image's fast-forward GPU tests and the small GPU tests of the runtime (the slice's: flashtests)
    (cd /tmp && TFC_INSTANT_FAILURES=1 timeout 360 python3 -m pytest -q -p no:cacheprovider -p no:warnings -rA \
      "$R/tests/kernels/test_kernels_gpu.py::test_sinkhorn_matches_the_models_loop" "$R/tests/runtime/engine/test_sampling_gpu.py" \
      "$R/tests/runtime/models/dsv41/test_host_stage.py" "$R/tests/runtime/models/dsv41/test_fast_gpu.py" -k "not flash_slice") \
      > "$OUT/fast_gpu_tests.txt" 2>&1
    tail -15 "$OUT/fast_gpu_tests.txt" ;;
  servetests)  # tfc serve on the tiny image with the fast forward: the prefix cache's tiers through the openai client
    (cd /tmp && TFC_TEST_SERVE_DEVICE=cuda TFC_INSTANT_FAILURES=1 timeout 400 python3 -m pytest -q -p no:cacheprovider \
      -p no:warnings -rA --tb=short "$R/tests/runtime/server/test_server_prefix_cache.py") > "$OUT/serve_gpu_tests.txt" 2>&1
    tail -15 "$OUT/serve_gpu_tests.txt" ;;
  drafttests)  # drafted == serial on the fast forward: rollback == never fed and the engine (test_fast_drafting.py on the
              # GPU), tfc generate, tfc serve through the openai client (test_server_draft.py); tiny image, graphs on
    (cd /tmp && TFC_TEST_FAST_DEVICE=cuda TFC_TEST_SERVE_DEVICE=cuda TFC_INSTANT_FAILURES=1 timeout 420 python3 -m pytest -q \
      -p no:cacheprovider -p no:warnings -rA --tb=short "$R/tests/runtime/models/dsv41/test_fast_drafting.py" \
      "$R/tests/runtime/models/dsv41/test_fast_gpu.py::test_generate_drafted_equals_serial_on_the_fast_forward" \
      "$R/tests/runtime/server/test_server_draft.py") > "$OUT/draft_gpu_tests.txt" 2>&1
    tail -15 "$OUT/draft_gpu_tests.txt" ;;
  prefill)
    timeout "${TFC_PREFILL_S:-420}" python3 benchmarks/prefill_h200.py --image "$IMG" --out "$OUT/prefill_h200.json" \
      --budget-s "$(( ${TFC_PREFILL_S:-420} - 90 ))" ${TFC_PREFILL_ARGS:-} 2>&1 | grep -v "^DEBUG\|^INFO " | tail -20 ;;
  rowskernel)  # the many-row EXL3 product alone: launch variants, registers and spills, the 16-row kernel beside it
    timeout "${TFC_ROWS_S:-300}" python3 benchmarks/rows_kernel_h200.py --out "$OUT/rows_kernel_h200.json" ${TFC_ROWS_ARGS:-} 2>&1 | grep -v "^DEBUG\|^INFO " | tail -25 ;;
  attendrows)  # the attention kernel alone at Flash shapes: matrix-unit pieces against FMA, blocks, runs, rows
    timeout "${TFC_ATTEND_S:-300}" python3 benchmarks/attend_rows_h200.py --out "$OUT/attend_rows_h200.json" ${TFC_ATTEND_ARGS:-} 2>&1 | grep -v "^DEBUG\|^INFO " | tail -25 ;;
  attendncu)  # Nsight Compute on attend_rows' first launch at 2,048 rows (TFC_ATTEND_VARIANT, default the kernel's default)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    timeout 240 "$NCU" --clock-control none -k regex:_partial_kernel --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
      --section Occupancy --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis \
      --section SourceCounters --print-details all python3 benchmarks/attend_rows_h200.py --ncu --out /tmp/unused.json \
      --variants "${TFC_ATTEND_VARIANT:-mma3_h16_k32_s4_w8}" > "$OUT/ncu_attend.txt" 2>&1
    grep -E "Duration|Issue Slots Busy|Executed Ipc Active|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit|Stall|stalled|Pipe|Warp Cycles Per Issued|No Eligible|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Shared|Bank" "$OUT/ncu_attend.txt" | head -70 ;;
  rowsncu)  # Nsight Compute on the rows kernel (3-bit 4096 x 4096, 256 rows): speed of light, stalls, SASS opcodes
    export TRITON_CACHE_DIR=/tmp/tc_rows; rm -rf "$TRITON_CACHE_DIR"
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    timeout 240 "$NCU" --clock-control none -k regex:_rows_kernel --launch-skip 1 --launch-count 1 \
      --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
      --section Occupancy --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis \
      --print-details all python3 benchmarks/rows_kernel_h200.py --ncu --out /tmp/unused.json > "$OUT/ncu_rows.txt" 2>&1
    grep -E "Duration|Issue Slots Busy|Executed Ipc Active|Registers Per|Achieved Occupancy|Theoretical Occ|highest-utilized|Stall|stalled|Pipe|Warp Cycles Per Issued|Eligible Warps|No Eligible|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Shared" "$OUT/ncu_rows.txt" | head -60
    for c in $(find "$TRITON_CACHE_DIR" -name '_rows_kernel*.cubin'); do
      cuobjdump -sass "$c" | grep -oE '^\s+/\*[0-9a-f]{4}\*/\s+(@!?U?P[0-9T] )?[A-Z0-9_.]+' | awk '{print $NF}' \
        | sed 's/\..*//' | sort | uniq -c | sort -rn | head -30 > "$OUT/sass_rows_hist.txt"
      cuobjdump -sass "$c" > "$OUT/sass_rows.txt"
    done
    head -30 "$OUT/sass_rows_hist.txt" ;;
  scratchncu)  # Nsight Compute on the scratch decode (6-bit 4096 x 16384, then 3-bit 4096 x 4096)
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    timeout 200 "$NCU" --clock-control none -k regex:_decode_entries_kernel --launch-skip 1 --launch-count 4 \
      --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
      --section InstructionStats --section MemoryWorkloadAnalysis --print-details all \
      python3 benchmarks/scratch_decode_ncu.py > "$OUT/ncu_scratch.txt" 2>&1
    grep -E "exact|Duration|Issue Slots Busy|Registers Per|Achieved Occupancy|Theoretical Occ|Stall|stalled|Warp Cycles Per Issued|No Eligible|Memory Throughput|DRAM Throughput|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Executed Ipc|Block Limit" "$OUT/ncu_scratch.txt" | head -80 ;;
  pdl)  # what programmatic dependent launch saves a graphed chain of small dependent Triton kernels
    timeout 200 python3 benchmarks/pdl_chain_h200.py --out "$OUT/pdl_chain.json" 2>&1 | grep -v "^DEBUG\|^INFO " | tail -8 ;;
  moetiles)  # the prefill MoE's tiles alone at Flash's shapes, 2,048 tokens: the register cap on and off
    timeout 300 python3 benchmarks/moe_tiles_ncu.py --out "$OUT/moe_tiles.json" 2>&1 | grep -v "^DEBUG\|^INFO " | tail -5 ;;
  tilesncu)  # Nsight Compute on one of those tile launches: occupancy, stalls, issue slots
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -1)
    timeout 300 "$NCU" --clock-control none -k regex:_rows_kernel --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy --section LaunchStats \
      --section InstructionStats --section ComputeWorkloadAnalysis --print-details all \
      python3 benchmarks/moe_tiles_ncu.py --ncu > "$OUT/ncu_moe_tiles.txt" 2>&1
    grep -E "Duration|Issue Slots Busy|Executed Ipc|Registers Per|Achieved Occupancy|Theoretical Occ|Block Limit|Stall|Warp Cycles Per Issued|No Eligible|Eligible Warps" "$OUT/ncu_moe_tiles.txt" | head -60 ;;
  rowstests)  # the many-row kernels' GPU tests (every lane cut bit for bit) and the register-fed decode's PTX
    (cd /tmp && TFC_INSTANT_FAILURES=1 timeout "${TFC_ROWSTESTS_S:-300}" python3 -m pytest -q -p no:cacheprovider -p no:warnings \
      -rA --tb=short "$R/tests/kernels/test_exl3_rows_gpu.py" "$R/tests/kernels/test_exl3_mma_ptx.py") > "$OUT/rows_gpu_tests.txt" 2>&1
    grep -v "^DEBUG\|^INFO " "$OUT/rows_gpu_tests.txt" | tail -15 ;;
  prefilltests)  # the prefill forward on the GPU: chunkings equal, beside decode rows, against the decode steps, the engine
    (cd /tmp && TFC_TEST_FAST_DEVICE=cuda TFC_INSTANT_FAILURES=1 timeout "${TFC_PREFILLTESTS_S:-420}" python3 -m pytest -q \
      -p no:cacheprovider -p no:warnings -rA --tb=short "$R/tests/runtime/models/dsv41/test_fast_prefill.py") > "$OUT/prefill_gpu_tests.txt" 2>&1
    grep -v "^DEBUG\|^INFO " "$OUT/prefill_gpu_tests.txt" | tail -15 ;;
  drafting)  # the slice's decode steps, verify windows and DSpark drafter round, and the projection with drafting
    timeout 300 python3 benchmarks/decode_h200.py --image "$IMG" --no-reference --only decode,verify,drafter --budget-s 240 \
      --out "$OUT/drafting_h200.json" 2>&1 | grep "^\[" | tee "$OUT/drafting.log" ;;
  flashagree)  # the slice's layers against the reference, attend_rows' keys gathered per row and decoded in the runs
    TFC_FLASH_IMAGE=$IMG timeout "${TFC_FLASHAGREE_S:-300}" python3 benchmarks/flash_agreement_h200.py --out "$OUT/flash_agreement.json" 2>&1 \
      | grep -v "^DEBUG\|^INFO " | tail -4 ;;
  flashtests)  # the Flash slice's layer and kernel-call tests (test_fast_gpu.py -k flash_slice)
    (cd /tmp && TFC_INSTANT_FAILURES=1 TFC_FLASH_IMAGE=$IMG timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:warnings -rA \
      "$R/tests/runtime/models/dsv41/test_fast_gpu.py" -k flash_slice) > "$OUT/flash_gpu_tests.txt" 2>&1
    tail -15 "$OUT/flash_gpu_tests.txt" ;;
  stages)  # the stage kernels (tfc.kernels.{kv_pack,index_scores,attend_rows,mhc_stages,router_pick}): GPU tests, then each stage two ways
    (cd /tmp && TFC_INSTANT_FAILURES=1 timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:warnings -rA \
      "$R/tests/kernels/test_kv_pack_gpu.py" "$R/tests/kernels/test_attend_rows_gpu.py" "$R/tests/kernels/test_mhc_stages_gpu.py" \
      "$R/tests/kernels/test_router_pick_gpu.py") > "$OUT/stage_kernel_tests.txt" 2>&1
    tail -15 "$OUT/stage_kernel_tests.txt"
    timeout 240 python3 benchmarks/stages_h200.py --image "$IMG" --out "$OUT/stages_h200.json" 2>&1 | grep "^\[" | tee "$OUT/stages.log" ;;
  stagetests)  # the tiny image's graph == eager, concurrent == solo, chunking, pinned and teacher-forced tests
    (cd /tmp && TFC_INSTANT_FAILURES=1 timeout "${TFC_STAGETESTS_S:-240}" python3 -m pytest -q -p no:cacheprovider \
      -p no:warnings -rA --tb=short "$R/tests/runtime/models/dsv41/test_fast_gpu.py" \
      -k "graph_replay or concurrent or chunking or pinned or teacher or restored") > "$OUT/stage_fast_gpu_tests.txt" 2>&1
    grep -v "^DEBUG\|^INFO " "$OUT/stage_fast_gpu_tests.txt" | tail -15 ;;
  grouped)  # the grouped GEMM's, live rows' and attend_rows' GPU tests, the tiny image's exactness tests
    (cd /tmp && TFC_INSTANT_FAILURES=1 timeout "${TFC_GROUPED_TESTS_S:-200}" python3 -m pytest -q -p no:cacheprovider -p no:warnings -rA \
      --tb=short "$R/tests/kernels/test_kernels_gpu.py" "$R/tests/kernels/test_attend_rows_gpu.py" "$R/tests/runtime/models/dsv41/test_fast_gpu.py" \
      -k "grouped or attend_rows or graph_replay or concurrent or chunking or pinned or teacher") > "$OUT/grouped_gpu_tests.txt" 2>&1
    grep -v "^DEBUG\|^INFO " "$OUT/grouped_gpu_tests.txt" | tail -14 ;;
  variants)  # the decode step on the slice against variants of itself (step_variants_h200.py)
    timeout "${TFC_VARIANTS_S:-300}" python3 benchmarks/step_variants_h200.py --image "$IMG" --out "$OUT/step_variants.json" \
      --variants "${STEP_VARIANTS:-apart,mix512,split2,split1}" --budget-s "$(( ${TFC_VARIANTS_S:-300} - 60 ))" 2>&1 \
      | grep -v "^DEBUG\|^INFO " | tail -8 ;;
  decode)  # decode_h200's checks and decode part only (1, 4, 16 rows, pinned and unpinned launches), no reference
    timeout 420 python3 benchmarks/decode_h200.py --image "$IMG" --only decode --no-reference --out "$OUT/decode_h200.json" \
      --budget-s 400 2>&1 | grep "^\[" | tee "$OUT/decode.log" ;;
  speed)
    timeout 60 python3 benchmarks/sampling.py --out "$OUT/sampling_h200.json" 2>&1 | tail -4
    timeout 260 python3 benchmarks/decode_h200.py --image "$IMG" --quick --no-reference --out "$OUT/decode_h200.json" --budget-s 200 \
      2>&1 | grep "^\[" | tee "$OUT/decode.log" ;;
  serve)
    TOK=$WORK/vocab_tokenizer.json  # the slice carries no tokenizer: one that names every id, so replies are text
    python3 benchmarks/vocab_tokenizer.py "$TOK" --vocab 129280 > /dev/null
    timeout 450 python3 benchmarks/serve_cpu.py --image "$IMG" --device cuda --no-levels --reps 2 --ready-reps 2 \
      --tokenizer "$TOK" --no-draft --out "$OUT/serve_h200.json" 2>&1 | tail -30 ;;
  prefix)
    TOK=$WORK/vocab_tokenizer.json
    python3 benchmarks/vocab_tokenizer.py "$TOK" --vocab 129280 > /dev/null
    timeout 420 python3 benchmarks/prefix_cache.py --image "$IMG" --device cuda --tokens 16000 --reps 2 --restore-reps 9 \
      --vocab 600 --no-draft --tokenizer "$TOK" --out "$OUT/prefix_cache_h200.json" 2>&1 | tail -30 ;;
  restore)  # the host-tier restore only (prefix's second part)
    timeout 200 python3 benchmarks/prefix_cache.py --image "$IMG" --device cuda --tokens 16000 --reps 0 --restore-reps 15 \
      --vocab 600 --flash-kv --out "$OUT/restore_h200.json" 2>&1 | tail -30 ;;
  serveprof)  # where tfc serve's start-to-ready goes: three starts to /health ready, the second under cProfile
    TOK=$WORK/vocab_tokenizer.json
    python3 benchmarks/vocab_tokenizer.py "$TOK" --vocab 129280 > /dev/null
    timeout 300 python3 benchmarks/serve_boot_profile.py --image "$IMG" --device cuda --tokenizer "$TOK" \
      --out "$OUT/serveprof" ${TFC_SERVEPROF_ARGS:-} 2>&1 | tail -5
    grep -E "_boot_steps|warm_up|execute|load_model|snapshot|restore|import_module|wait_ready|listen|uvicorn.*run|tokenizer|capture|run_module" \
      "$OUT/serveprof/main_cumulative.txt" | head -40 | cut -c1-170 ;;
  bootprof)  # where a restart's start-to-ready goes: tfc load twice (the first compiles), the second profiled
    (cd /tmp && timeout 200 python3 -m tfc load "$IMG" --device cuda --json > "$OUT/load_first.json" 2> "$OUT/load_first.err" \
      && timeout 120 python3 -m cProfile -o "$OUT/load_restart.prof" -m tfc load "$IMG" --device cuda --json \
        > "$OUT/load_restart.json" 2> "$OUT/load_restart.err")
    python3 -c "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('cumulative').print_stats(45)" \
      "$OUT/load_restart.prof" > "$OUT/load_restart_top.txt" 2>&1
    python3 -c "import pstats,sys; pstats.Stats(sys.argv[1]).sort_stats('tottime').print_stats(25)" \
      "$OUT/load_restart.prof" > "$OUT/load_restart_self.txt" 2>&1
    python3 -c "import json,sys; [print(f, json.load(open(f)).get('stage_kernels'), json.load(open(f)).get('notes'), json.load(open(f))['wall_ms']) for f in sys.argv[1:]]" \
      "$OUT/load_first.json" "$OUT/load_restart.json"; head -40 "$OUT/load_restart_self.txt" ;;
  parallel)
    timeout 300 python3 benchmarks/parallel_cpu.py --reps ${REPS:-3} --tokens 8 --iters 20 --out "$OUT/parallel_16core.json" \
      2>&1 | tail -12 ;;
  *) echo "usage: bash benchmarks/h200_serving.sh prefill|prefilltests|tests|servetests|drafttests|drafting|warmup|flashtests|retests|speed|sampling|serve|prefix|restore|parallel|bootprof|serveprof|stagenotes|nocompile|stages|stagedecode|stageserve|stagetests ..." >&2; exit 2 ;;
esac
done
# A device call brings back a few files only: everything in one archive (and the logs' tails above).
(cd "$OUT" && tar -czf /tmp/h200_all.tgz . && find . -mindepth 1 -delete && mv /tmp/h200_all.tgz all.tgz)
