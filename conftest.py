"""Test setup shared by `tests/` and the docstring examples (`--doctest-modules`)."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _isolate_keras_state(doctest_namespace):
    """Each test starts with float32 and a fixed seed, whatever the previous one set."""
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    doctest_namespace.update(keras=keras, np=np, ops=keras.ops)
    yield
    keras.config.set_dtype_policy("float32")
