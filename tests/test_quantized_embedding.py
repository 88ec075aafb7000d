"""Tests of `keras_attn.quantization.QuantizedEmbedding`: the table rounded to one symmetric
int8 scale (numpy reference), gradients through the rounding, Keras integration."""

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import ops

from keras_attn.quantization import QuantizedEmbedding
from tests.layer_test_case import run_layer_test
from tests.numpy_reference import numpy_rows

IDS = np.array([[1, 5, 9, 0], [3, 3, 7, 2]], "int32")


def test_rows_are_the_int8_rows_of_the_table():
    layer = QuantizedEmbedding(10, 6, embeddings_initializer="random_normal")
    rows = ops.convert_to_numpy(layer(IDS))
    table = layer.embeddings.numpy()
    np.testing.assert_allclose(rows, numpy_rows(table, IDS), atol=1e-6)
    assert np.abs(rows - table[IDS]).max() > 1e-4  # rounded, not the float rows
    layer.freeze_weight_ranges()
    np.testing.assert_allclose(ops.convert_to_numpy(layer(IDS)), rows, atol=1e-7)


@pytest.mark.tensorflow  # tf.GradientTape
def test_gradients_pass_the_rounding_to_the_rows_looked_up():
    layer = QuantizedEmbedding(10, 6, embeddings_initializer="random_normal")
    layer.build(IDS.shape)
    with tf.GradientTape() as tape:
        loss = ops.sum(layer(IDS) * 2.0)
    (gradient,) = tape.gradient(loss, layer.trainable_variables)
    counts = np.bincount(IDS.ravel(), minlength=10)[:, None]
    np.testing.assert_allclose(ops.convert_to_numpy(gradient), np.broadcast_to(
        2.0 * counts, (10, 6)), atol=1e-6)


def test_run_layer_test():
    rows = run_layer_test(QuantizedEmbedding, {"input_dim": 10, "output_dim": 6,
                                               "mask_zero": True}, IDS,
                          expected_output_shape=(2, 4, 6))
    assert np.isfinite(rows).all()


def test_lora_is_refused():
    with pytest.raises(ValueError, match="LoRA"):
        QuantizedEmbedding(10, 6, lora_rank=2)
    assert isinstance(keras.layers.deserialize(keras.layers.serialize(
        QuantizedEmbedding(10, 6))), QuantizedEmbedding)
