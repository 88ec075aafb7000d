"""Tests of `keras_attn.quantization.QuantizedReversibleEmbedding`: the lookup and the tied
(or untied) output projection read the table rounded to one symmetric int8 scale (numpy
reference), gradients through the rounding, Keras integration."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_attn.quantization import QuantizedReversibleEmbedding
from tests.layer_test_case import run_layer_test
from tests.numpy_reference import numpy_rows

IDS = np.array([[1, 5, 9, 0], [3, 3, 7, 2]], "int32")
HIDDEN = np.random.default_rng(0).normal(size=(2, 3, 6)).astype("float32")


def int8_table(table):
    """`s round(E / s)`, `s = max|E| / 127` (numpy)."""
    step = np.abs(table).max() / 127
    return np.round(table / step) * step


@pytest.mark.parametrize("tie_weights", [True, False])
def test_lookup_and_logits_read_the_int8_table(tie_weights):
    layer = QuantizedReversibleEmbedding(10, 6, tie_weights=tie_weights,
                                         embeddings_initializer="random_normal")
    rows = ops.convert_to_numpy(layer(IDS))
    table = layer.embeddings.numpy()
    np.testing.assert_allclose(rows, numpy_rows(table, IDS), atol=1e-6)
    logits = ops.convert_to_numpy(layer(HIDDEN, reverse=True))
    reverse = table.T if tie_weights else layer.reverse_embeddings.numpy()  # (6, 10)
    np.testing.assert_allclose(logits, HIDDEN @ int8_table(reverse), atol=1e-5)
    assert np.abs(logits - HIDDEN @ reverse).max() > 1e-4  # rounded, not the float table
    layer.freeze_weight_ranges()
    np.testing.assert_allclose(ops.convert_to_numpy(layer(HIDDEN, reverse=True)), logits,
                               atol=1e-6)
    np.testing.assert_allclose(ops.convert_to_numpy(layer(IDS)), rows, atol=1e-7)


@pytest.mark.tensorflow  # tf.GradientTape
def test_gradients_pass_the_rounding_of_the_tied_table():
    layer = QuantizedReversibleEmbedding(10, 6, embeddings_initializer="random_normal")
    layer.build(IDS.shape)
    with tf.GradientTape() as tape:
        loss = ops.sum(layer(HIDDEN, reverse=True))
    (gradient,) = tape.gradient(loss, layer.trainable_variables)
    # d sum(h E^T) / dE = sum over positions of h, for every row.
    np.testing.assert_allclose(ops.convert_to_numpy(gradient), np.broadcast_to(
        HIDDEN.reshape(-1, 6).sum(0), (10, 6)), atol=1e-5)


def test_run_layer_test_and_what_it_refuses():
    rows = run_layer_test(QuantizedReversibleEmbedding, {"input_dim": 10, "output_dim": 6},
                          IDS, expected_output_shape=(2, 4, 6))
    assert np.isfinite(rows).all()
    with pytest.raises(ValueError, match="logit_soft_cap"):
        QuantizedReversibleEmbedding(10, 6, logit_soft_cap=30.0)
    assert isinstance(keras.layers.deserialize(keras.layers.serialize(
        QuantizedReversibleEmbedding(10, 6, tie_weights=False))), QuantizedReversibleEmbedding)
