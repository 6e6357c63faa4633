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

bench: $(VENV)/.ready
	$(BIN)/python benchmarks/run_cpu.py

clean:
	rm -rf $(VENV) $(DEMO) build *.egg-info
