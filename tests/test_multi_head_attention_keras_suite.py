"""Keras' own test file for `keras.layers.MultiHeadAttention`, run on ours.

The file is read from the installed Keras (`keras/src/layers/attention/
multi_head_attention_test.py`, Keras 3.15.1 as pinned in setup.cfg, Apache-2.0) and
executed unchanged, except that the name `layers.MultiHeadAttention` it uses means
`keras_attn.layers.MultiHeadAttention`; every other `layers.X` is Keras' own. Pytest
collects its `MultiHeadAttentionTest` (48 pass on TensorFlow, 2 flash-attention tests skip
there as for Keras' layer). Run the JAX variant with `KERAS_BACKEND=jax`.
"""

import importlib.util
import os
import types

import keras
import pytest
from keras.src import layers as keras_layers  # Keras' layers for every other name

from keras_attn.layers import MultiHeadAttention

KERAS_TEST_FILE = os.path.join(
    os.path.dirname(keras.src.__file__), "layers", "attention", "multi_head_attention_test.py"
)

if not os.path.exists(KERAS_TEST_FILE):
    pytest.skip(
        f"Keras' test file is not installed ({KERAS_TEST_FILE}); install the keras wheel "
        "pinned in setup.cfg, which ships it",
        allow_module_level=True,
    )


class _LayersWithOurAttention(types.ModuleType):
    """`keras.src.layers` with `MultiHeadAttention` replaced by ours."""

    MultiHeadAttention = MultiHeadAttention

    def __getattr__(self, name):
        return getattr(keras_layers, name)


def _load_keras_tests():
    spec = importlib.util.spec_from_file_location("keras_mha_test_on_keras_attn", KERAS_TEST_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.layers = _LayersWithOurAttention("layers")  # the test bodies read it at call time
    return module


MultiHeadAttentionTest = _load_keras_tests().MultiHeadAttentionTest


def test_the_suite_runs_our_layer():
    """The swap took: the class the suite instantiates is ours, and Keras' own still exists."""
    module = _load_keras_tests()
    assert module.layers.MultiHeadAttention is MultiHeadAttention
    assert module.layers.Embedding is keras.layers.Embedding
    assert MultiHeadAttention is not keras.layers.MultiHeadAttention
