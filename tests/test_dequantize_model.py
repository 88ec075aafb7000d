"""`dequantize_model`, and `quantize_model` -> `calibrate_model` -> QAT `fit` -> the float
model, on every Keras backend (the TFLite files are tested in test_quantize_model.py)."""

import keras
import numpy as np

from keras_attn.layers import TokenAndPositionEmbedding
from keras_attn.layers import TransformerEncoderBlock
from keras_attn.quantization import QuantizationRecipe
from keras_attn.quantization import calibrate_model
from keras_attn.quantization import dequantize_model
from keras_attn.quantization import quantize_model


def layers_model():
    token_ids = keras.Input((12,), dtype="int32")
    segment_ids = keras.Input((12,), dtype="int32")
    x = TokenAndPositionEmbedding(50, 12, 32, num_segments=2, mask_zero=True)(
        token_ids, segment_ids=segment_ids)
    for _ in range(2):
        x = TransformerEncoderBlock(4, 64, activation="gelu_approximate")(x)
    return keras.Model([token_ids, segment_ids], keras.layers.Dense(2, name="head")(x[:, 0]))


def test_qat_fits_and_the_float_model_holds_its_weights():
    """The default recipe's copy (float residual, 4 float channels per block) is calibrated,
    trained with `fit` (the loss falls, the weights move) and turned back into the float
    model, which holds the trained weights."""
    keras.utils.set_random_seed(0)
    model = layers_model()
    rng = np.random.default_rng(0)
    ids = rng.integers(2, 50, (256, 12)).astype("int32")
    ids[np.arange(12)[None] >= rng.integers(4, 13, 256)[:, None]] = 0
    inputs, labels = [ids, np.zeros_like(ids)], (ids == 7).any(-1).astype("int32")
    qat = quantize_model(model, **QuantizationRecipe().layout())
    calibrate_model(qat, [[part[:128] for part in inputs]])
    qat.compile(keras.optimizers.Adam(3e-3),
                keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    losses = qat.fit(inputs, labels, epochs=6, batch_size=32, verbose=0).history["loss"]
    assert losses[-1] < losses[0], losses
    trained = dequantize_model(qat)
    assert [type(layer).__name__ for layer in trained.layers] == [
        type(layer).__name__ for layer in model.layers]
    np.testing.assert_array_equal(trained.get_layer("head").kernel.numpy(),
                                  qat.get_layer("head").kernel.numpy())
    assert not np.allclose(trained.get_layer("head").kernel.numpy(),
                           model.get_layer("head").kernel.numpy())
    # And back again: quantize -> dequantize gives the same float function.
    outputs = keras.ops.convert_to_numpy(trained(inputs))
    np.testing.assert_allclose(
        keras.ops.convert_to_numpy(dequantize_model(quantize_model(trained))(inputs)),
        outputs, atol=1e-5)
