# Sourced by the H200 scripts: environment, output and work folders, tfc and the carried wheels into /tmp/site.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
WORK=${WORK:-/tmp/tfcbench}; mkdir -p "$WORK"
# Bytecode kept between processes (outside the tree and $OUT), as an installed torch has it: without it every
# process compiles torch's sources again (~7 s of a restart's start-to-ready under cProfile, run of 2026-12-01).
unset PYTHONDONTWRITEBYTECODE  # the machine's environment may set it
export PYTHONUNBUFFERED=1 PYTHONPYCACHEPREFIX=$WORK/pycache
{ [ -f /tmp/site/.wheels ] || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.wheels; }; } \
  && python3 -m pip install -q --upgrade --no-index --no-deps --no-build-isolation --target /tmp/site . \
  && export PYTHONPATH=/tmp/site || { echo "install failed"; exit 1; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader | tee "$OUT/gpu.txt"
