# Two commands set a fresh machine up: `make demo` and `make test`. Both create and use .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := .demo

.PHONY: demo test lint bench clean

$(VENV)/.ready: pyproject.toml
	@if $(PY) -c "import torch" 2>/dev/null; then \
		$(PY) -m venv --system-site-packages $(VENV); \
	else \
		$(PY) -m venv $(VENV); \
	fi
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test,kernels]'
	@touch $@

demo: $(VENV)/.ready
	@rm -rf $(DEMO) && mkdir -p $(DEMO)
	$(BIN)/tfc fixture tiny $(DEMO)/pack
	$(BIN)/tfc inspect $(DEMO)/pack
	$(BIN)/tfc plan $(DEMO)/pack --tp 2
	$(BIN)/tfc prepare $(DEMO)/pack --tp 1 -o $(DEMO)/images > $(DEMO)/tp1.path
	$(BIN)/tfc prepare $(DEMO)/pack --tp 2 -o $(DEMO)/images > $(DEMO)/tp2.path
	$(BIN)/tfc verify $$(cat $(DEMO)/tp1.path)
	$(BIN)/tfc verify $$(cat $(DEMO)/tp2.path)
	$(BIN)/tfc load $$(cat $(DEMO)/tp1.path)
	$(BIN)/tfc generate $$(cat $(DEMO)/tp1.path) --prompt "The model reads the prompt" --max-tokens 16

test: $(VENV)/.ready
	$(BIN)/python -m pytest

lint: $(VENV)/.ready
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# CPU benchmarks of this machine (GPU ones: benchmarks/h200_all.sh and benchmarks/kernels_h200.py on an H200).
bench: $(VENV)/.ready
	$(BIN)/python benchmarks/cli_flash.py --command inspect --limit 1.0 --out benchmarks/results/cli/inspect_flash.md
	$(BIN)/python benchmarks/cli_flash.py --command "plan --tp 2 --json" --limit 1.5 --out benchmarks/results/cli/plan_flash.md
	$(BIN)/python benchmarks/engram_map.py
	$(BIN)/python benchmarks/engram_hash.py
	$(BIN)/python benchmarks/verify_local.py --size-gb 4 --out benchmarks/results/verify/verify_local.md

clean:
	rm -rf $(VENV) $(DEMO) build *.egg-info
