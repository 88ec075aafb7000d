import keras
import numpy as np
import pytest

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from tests.numpy_reference import fake_quant_reference


def test_fake_quant_matches_numpy_reference():
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(4, 50)) * 3).astype("float32")
    quantizer = ActivationQuantizer()
    y = keras.ops.convert_to_numpy(quantizer(x, training=True))
    low, high = float(quantizer.min_value.numpy()), float(quantizer.max_value.numpy())
    assert low == pytest.approx(float(x.min())) and high == pytest.approx(float(x.max()))
    np.testing.assert_allclose(y, fake_quant_reference(x, low, high), atol=1e-5)
    # At most 256 distinct values, and the error is at most half a step.
    assert len(np.unique(y)) <= 256
    assert np.abs(y - x).max() <= (high - low) / 255 / 2 + 1e-5


def test_ema_update_in_training_and_frozen_in_inference():
    quantizer = ActivationQuantizer(decay=0.9)
    quantizer(np.array([[-1.0, 2.0]], "float32"), training=True)  # initializes
    quantizer(np.array([[-3.0, 4.0]], "float32"), training=True)
    assert float(quantizer.min_value.numpy()) == pytest.approx(0.9 * -1.0 + 0.1 * -3.0)
    assert float(quantizer.max_value.numpy()) == pytest.approx(0.9 * 2.0 + 0.1 * 4.0)
    # Zero stays in the range: an all-positive batch still has min <= 0.
    fresh = ActivationQuantizer()
    fresh(np.array([[1.0, 2.0]], "float32"), training=True)
    assert float(fresh.min_value.numpy()) == 0.0
    before = (float(quantizer.min_value.numpy()), float(quantizer.max_value.numpy()))
    y = quantizer(np.array([[-50.0, 50.0]], "float32"), training=False)
    assert (float(quantizer.min_value.numpy()), float(quantizer.max_value.numpy())) == before
    np.testing.assert_allclose(keras.ops.convert_to_numpy(y),
                               fake_quant_reference(np.array([[-50.0, 50.0]]), *before),
                               atol=1e-5)


def test_stats_mask_excludes_masked_entries_and_puts_them_at_the_bottom():
    quantizer = ActivationQuantizer(mask_margin=4.0)
    x = np.array([[1.0, -2.0, 100.0]], "float32")
    mask = np.array([[True, True, False]])
    y = keras.ops.convert_to_numpy(quantizer(x, stats_mask=mask, training=True))
    assert float(quantizer.max_value.numpy()) == 1.0  # 100 was masked out
    low = float(quantizer.min_value.numpy()) - 4.0
    expected = fake_quant_reference(np.array([[1.0, -2.0, low]]), low, 1.0)
    np.testing.assert_allclose(y, expected, atol=1e-5)
    # The float twin uses an exact -1e9.
    float_twin = ActivationQuantizer(quantize=False)
    y = keras.ops.convert_to_numpy(float_twin(x, stats_mask=mask, training=True))
    np.testing.assert_array_equal(y, [[1.0, -2.0, -1e9]])


def test_fixed_range_is_not_learned():
    quantizer = ActivationQuantizer(fixed_range=(0.0, 255.0 / 256.0))
    y = quantizer(np.array([[0.5, 2.0]], "float32"), training=True)
    assert float(quantizer.max_value.numpy()) == 255.0 / 256.0
    np.testing.assert_allclose(keras.ops.convert_to_numpy(y), [[0.5, 255.0 / 256.0]])


def test_quantize_false_is_identity_but_tracks_ranges():
    quantizer = ActivationQuantizer(quantize=False)
    x = np.array([[0.1234567, -0.7654321]], "float32")
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(quantizer(x, training=True)), x)
    assert float(quantizer.min_value.numpy()) == pytest.approx(-0.7654321)


def test_serialization_round_trip(tmp_path):
    quantizer = ActivationQuantizer(decay=0.99, mask_margin=3.0, quantize=False)
    clone = ActivationQuantizer.from_config(quantizer.get_config())
    assert clone.get_config() == quantizer.get_config()
    inputs = keras.Input((5,))
    model = keras.Model(inputs, ActivationQuantizer(name="q")(inputs))
    x = np.linspace(-2, 3, 10, dtype="float32").reshape(2, 5)
    model.get_layer("q")(x, training=True)
    path = str(tmp_path / "q.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert float(loaded.get_layer("q").max_value.numpy()) == pytest.approx(3.0)
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(decay=1.0), "decay"),
        (dict(fixed_range=(0.5, 1.0)), "fixed_range"),
        (dict(mask_margin=-1.0), "mask_margin"),
        (dict(quantize="yes"), "quantize"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ActivationQuantizer(**kwargs)


def test_the_keras_mask_passes_through():
    """Elementwise: a padding mask (`Embedding(mask_zero=True)`) reaches the next layer, as
    without the quantizer (quantize_model puts one after each rounded layer)."""
    ids = np.array([[3, 4, 0, 0]])
    rows = keras.layers.Embedding(8, 4, mask_zero=True)(ids)
    quantized = ActivationQuantizer()(rows, training=True)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(quantized._keras_mask), ids != 0)
