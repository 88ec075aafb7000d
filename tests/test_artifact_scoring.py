"""Tests of `keras_attn.export.artifact_scoring`: the traced Keras predictor that scores
every artifact against the float model."""

import logging

import keras
import numpy as np
import pytest

from keras_attn.export.artifact_scoring import traced_predict
from tests.test_run_directory import WarningLines

pytestmark = pytest.mark.tensorflow  # a tf.function of the model


def _tiny_classifier(seed):
    """`token_ids`, `segment_ids`, `padding_mask` -> `(B, 2)` logits (mean of embeddings)."""
    inputs = {name: keras.Input((None,), dtype="int32", name=name)
              for name in ("token_ids", "segment_ids", "padding_mask")}
    tokens = keras.layers.Embedding(10, 4, embeddings_initializer=keras.initializers.RandomNormal(
        seed=seed))(inputs["token_ids"])
    segments = keras.layers.Embedding(2, 4)(inputs["segment_ids"])
    mask = keras.ops.expand_dims(keras.ops.cast(inputs["padding_mask"], "float32"), -1)
    pooled = keras.ops.sum((tokens + segments) * mask, axis=1)
    return keras.Model(inputs, keras.layers.Dense(2)(pooled))


def test_many_traced_models_give_keras_outputs_without_retracing_warnings():
    """Each model traces once; TensorFlow keys its retracing detector on the code object of
    the traced function, shared by every model's predictor, so calling predictors of six
    models once each must not read as '5 out of the last 6 calls triggered retracing'."""
    rng = np.random.default_rng(0)
    handler = WarningLines()
    logger = logging.getLogger("tensorflow")
    logger.addHandler(handler)
    try:
        for seed in range(6):
            model = _tiny_classifier(seed)
            predict = traced_predict(model)
            for batch, length in ((1, 3), (4, 7)):
                x = {"token_ids": rng.integers(0, 10, (batch, length)),
                     "segment_ids": rng.integers(0, 2, (batch, length)),
                     "padding_mask": np.ones((batch, length), "int32")}
                expected = keras.ops.convert_to_numpy(model(x, training=False))
                np.testing.assert_allclose(predict(x), expected, rtol=1e-6, atol=1e-6)
    finally:
        logger.removeHandler(handler)
    assert [line for line in handler.lines if "retracing" in line] == []
