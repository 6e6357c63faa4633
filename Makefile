# Two commands set a fresh machine up: `make demo` and `make test` (`make test-fast` for the fast lane). All
# create and use .venv.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
DEMO := .demo
DEMO_PORT ?= 8765

# The demo's client: wait for /health, then one chat completion with the official openai client.
define DEMO_CLIENT
import sys, time, urllib.request
from openai import OpenAI
url = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(600):
    try:
        if urllib.request.urlopen(url + "/health", timeout=2).status == 200:
            break
    except OSError:
        time.sleep(0.1)
reply = OpenAI(base_url=url + "/v1", api_key="demo").chat.completions.create(
    model="tiny", messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0)
print(f"chat (random weights, noise by design): {reply.choices[0].message.content!r} ({reply.usage.completion_tokens} tokens, {reply.choices[0].finish_reason}, token_sha {reply.token_sha[:16]})")
endef
export DEMO_CLIENT

.PHONY: demo test test-fast lint bench clean

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
	@echo "tfc demo: a tiny synthetic DeepSeek-V4.1 pack in the real layout. Its weights are RANDOM, so every"
	@echo "generated text below is noise by design: the demo shows the pipeline, not a model's answers."
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
	@echo "tfc serve on 127.0.0.1:$(DEMO_PORT), one chat request through the openai client, then SIGTERM"
	@$(BIN)/tfc serve $$(cat $(DEMO)/tp1.path) --port $(DEMO_PORT) --model-name tiny & pid=$$!; \
	$(BIN)/python -c "$$DEMO_CLIENT" $(DEMO_PORT); code=$$?; kill -TERM $$pid; wait $$pid; exit $$code

# The full suite (what CI runs, .ci/run), in TEST_WORKERS processes (pytest-xdist; CI has 2 cores). Any pytest
# failure fails make, exit code 5 (no tests collected) too, said in one line: a run that tested nothing is not a pass.
TEST_WORKERS ?= 2
test: $(VENV)/.ready
	$(BIN)/python -m pytest -n $(TEST_WORKERS) || { rc=$$?; [ $$rc -ne 5 ] || echo "make $@: pytest collected no tests" >&2; exit $$rc; }

# The fast lane (about a minute on 2 cores): the suite without the tests marked @pytest.mark.slow.
test-fast: $(VENV)/.ready
	$(BIN)/python -m pytest -n $(TEST_WORKERS) -m "not slow" || { rc=$$?; [ $$rc -ne 5 ] || echo "make $@: pytest collected no tests" >&2; exit $$rc; }

lint: $(VENV)/.ready
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# The CPU benchmarks on this machine (a 22 GB pack: ~50 GB of free disk), results under benchmarks/results/ and in
# summary.json (the GPU ones: bash benchmarks/gpu_all.sh on a GPU machine; python benchmarks/_summary.py --readme
# then puts the figures into the README's table).
bench: $(VENV)/.ready
	$(BIN)/python benchmarks/cli.py --json
	$(BIN)/python benchmarks/prepare_verify.py --work .bench --json; code=$$?; rm -rf .bench; exit $$code

clean:
	rm -rf $(VENV) $(DEMO) .bench build *.egg-info
