"""The quantized LayerNorm of `qat_embeddings` against a numpy reference of its
fake-quantized chain, including rows whose variance rounds to int8 code 0."""

import keras
import numpy as np

from keras_attn.layers.quantized_layer_normalization import layer_norm
from keras_attn.layers.quantized_layer_normalization import layer_norm_quantizers
from tests.numpy_reference import fake_quant_reference


def np_quantized_layer_norm(x, gamma, beta, epsilon):
    """Each intermediate fake-quantized with its own batch min/max (the first training
    step sets the range to the batch's), variance floored at one step of its range."""
    def q(t):
        return fake_quant_reference(t, min(0.0, t.min()), max(0.0, t.max()))

    mean = q(x.mean(-1, keepdims=True))
    centered = q(x - mean)
    variance = q((centered * centered).mean(-1, keepdims=True) + epsilon)
    step = max(0.0, variance.max()) / 255
    inverse_std = q(1 / np.sqrt(np.maximum(variance, max(step, epsilon))))
    return centered * inverse_std * gamma + beta


def test_rows_with_tiny_variance_stay_finite_and_match_the_reference():
    rng = np.random.default_rng(0)
    hidden = 16
    # Row 0 has a variance of ~900, so one int8 step of the variance range is ~10 and
    # rows 1-2 (variance 1e-6 and exactly 0) round to code 0: rsqrt(0) was inf.
    x = np.stack([rng.normal(0, 30, hidden), rng.normal(5, 1e-3, hidden),
                  np.full(hidden, 2.0)]).astype("float64")
    gamma = rng.normal(1, 0.1, hidden)
    beta = rng.normal(0, 0.1, hidden)
    quantizers = layer_norm_quantizers("ln", decay=0.99, quantize=True)
    y = keras.ops.convert_to_numpy(layer_norm(
        keras.ops.convert_to_tensor(x.astype("float32")),
        keras.ops.convert_to_tensor(gamma.astype("float32")),
        keras.ops.convert_to_tensor(beta.astype("float32")),
        1e-12, quantizers, training=True))
    assert np.all(np.isfinite(y))
    for quantizer in quantizers.values():
        assert np.isfinite(float(quantizer.min_value.numpy()))
        assert np.isfinite(float(quantizer.max_value.numpy()))
    np.testing.assert_allclose(y, np_quantized_layer_norm(x, gamma, beta, 1e-12),
                               rtol=1e-4, atol=1e-4)


def test_float_twin_is_the_exact_layer_norm():
    rng = np.random.default_rng(1)
    x = rng.normal(0, 3, (4, 8)).astype("float32")
    quantizers = layer_norm_quantizers("ln", decay=0.99, quantize=False)
    y = keras.ops.convert_to_numpy(layer_norm(x, np.ones(8, "float32"), np.zeros(8, "float32"),
                                              1e-6, quantizers, training=True))
    mean = x.mean(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
