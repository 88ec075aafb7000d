"""Test setup shared by `tests/` and the docstring examples (`--doctest-modules`)."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from tests.session_cache import set_session_root  # noqa: E402

# Scripts that made the reference fixtures; they need PyTorch and run outside the suite.
collect_ignore = ["tests/fixtures"]

# Library packages built on TensorFlow by design (tf-text, tf.data): their docstring
# examples run on the TensorFlow backend only.
TF_PACKAGES = ("text", "training", "runs", "export", "quantization", "inference")


# The modules that take longest in `make test` or `make test-slow` (`--durations`, AMD EPYC
# 2-core, 2026-11-28: 50 s to 220 s each), run first: both send each module whole to one
# worker (`--dist loadscope`, so a module's fixtures are built once, not once per worker)
# and the short modules then fill in, so that both workers end together.
LONGEST_FIRST = ("test_run_exporter", "test_crash_safety", "test_trainer", "test_predictor",
                 "test_docs", "test_permutation_lm_task", "test_demo",
                 "test_benchmarks_web_latency", "test_keras_native_export",
                 "test_word_splitter", "test_transformer_xl_task",
                 "test_export_benchmark_scripts", "test_quantization_budget",
                 "test_run_directory", "test_quantization_sensitivity",
                 "test_onnx_int8_artifacts", "test_tflite_export",
                 "test_translation_exporter", "test_generation_exporter")


def _longest_first(item):
    name = item.path.stem
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    """The longest modules first (`LONGEST_FIRST`); tests marked `tensorflow` (tf.data,
    tf-text, SavedModel, TFLite) skip on other backends."""
    items.sort(key=_longest_first)  # stable: the order within each module is kept
    if keras.config.backend() == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"needs the TensorFlow backend, not {keras.config.backend()}")
    for item in items:
        in_tf_package = any(f"/keras_attn/{name}/" in str(item.path) for name in TF_PACKAGES)
        if item.get_closest_marker("tensorflow") or in_tf_package:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory, request):
    """One directory for the runs the whole session shares (`tests/session_cache.py`):
    pytest-xdist workers' base temp directories sit in the controller's, so theirs is common."""
    base = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        base = base.parent
    set_session_root(base / "session_cache")


@pytest.fixture(autouse=True)
def _isolate_keras_state(doctest_namespace):
    """Each test starts with float32 and a fixed seed, whatever the previous one set."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    doctest_namespace.update(keras=keras, np=np, ops=keras.ops)
    yield
    keras.config.set_dtype_policy("float32")
