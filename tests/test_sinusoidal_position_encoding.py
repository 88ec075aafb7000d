import math

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attn.layers.sinusoidal_position_encoding import sinusoidal_table
from tests.layer_test_case import run_layer_test


def reference_pe(length, d_model, max_wavelength=10000.0, start=0):
    """Vaswani et al. (2017) §3.5, one entry at a time."""
    pe = np.zeros((length, d_model))
    for t in range(length):
        pos = start + t
        for col in range(d_model):
            i = col // 2
            angle = pos / max_wavelength ** (2 * i / d_model)
            pe[t, col] = math.sin(angle) if col % 2 == 0 else math.cos(angle)
    return pe


def test_matches_paper_formula_d512():
    x = np.zeros((2, 50, 512), "float32")
    out = ops.convert_to_numpy(SinusoidalPositionEncoding()(x))
    assert out.shape == (2, 50, 512)
    expected = reference_pe(50, 512)
    np.testing.assert_allclose(out[0], expected, atol=1e-5)
    np.testing.assert_allclose(out[1], expected, atol=1e-5)


def test_worked_example_d4_from_the_notes():
    # Seed 002: e'_w = e_w + [sin(pos), cos(pos), sin(pos/100), cos(pos/100)] for d=4.
    table = ops.convert_to_numpy(sinusoidal_table(8, 4))
    for pos in range(8):
        expected = [math.sin(pos), math.cos(pos), math.sin(pos / 100), math.cos(pos / 100)]
        np.testing.assert_allclose(table[pos], expected, atol=1e-6)


def test_interleaved_not_half_and_half():
    # The jalammar picture the notes call incorrect puts all sines first. Ours interleaves.
    table = ops.convert_to_numpy(sinusoidal_table(1, 8))[0]
    np.testing.assert_allclose(table, [0, 1, 0, 1, 0, 1, 0, 1], atol=1e-7)


def test_odd_d_model_last_column_is_sin():
    table = ops.convert_to_numpy(sinusoidal_table(6, 5, start_index=3))
    np.testing.assert_allclose(table, reference_pe(6, 5, start=3), atol=1e-5)
    pos = 5  # row 2 of a table starting at 3
    np.testing.assert_allclose(table[2, 4], math.sin(pos / 10000 ** (4 / 5)), atol=1e-6)


def test_differs_from_the_buggy_torch_table_in_the_notes():
    # The seed's loop uses 10000 ** ((2 * i) / d) with i already stepping by 2 (and
    # 2 * (i + 1) for the cosine), so it prints 0.0251 at (pos=1, col=2) for d=10.
    # The formula's column 2 is i=1: sin(1 / 10000^(2/10)).
    table = ops.convert_to_numpy(sinusoidal_table(2, 10))
    assert table[1, 2] == pytest.approx(math.sin(1 / 10000 ** (2 / 10)), abs=1e-6)
    assert table[1, 2] == pytest.approx(0.1578, abs=1e-4)
    assert abs(table[1, 2] - 0.0251) > 0.1
    # Column 1 too: the seed prints cos(1 / 10000^(2/10)) = 0.9875, the formula cos(1).
    assert table[1, 1] == pytest.approx(math.cos(1.0), abs=1e-6)
    assert abs(table[1, 1] - 0.9875) > 0.4


def test_start_index_gives_later_rows():
    full = ops.convert_to_numpy(SinusoidalPositionEncoding()(np.zeros((1, 10, 6))))
    for k in (0, 3, 7):
        part = SinusoidalPositionEncoding()(np.zeros((1, 3, 6)), start_index=k)
        np.testing.assert_allclose(ops.convert_to_numpy(part), full[:, k:k + 3], atol=1e-6)
    # A scalar tensor works like an int.
    part = SinusoidalPositionEncoding()(
        np.zeros((1, 3, 6)), start_index=ops.convert_to_tensor(4, "int32")
    )
    np.testing.assert_allclose(ops.convert_to_numpy(part), full[:, 4:7], atol=1e-6)


def test_max_wavelength():
    out = ops.convert_to_numpy(SinusoidalPositionEncoding(max_wavelength=100)(np.zeros((1, 7, 4))))
    np.testing.assert_allclose(out[0], reference_pe(7, 4, max_wavelength=100), atol=1e-6)


def test_output_in_compute_dtype_and_bounded():
    layer = SinusoidalPositionEncoding(dtype="mixed_bfloat16")
    out = layer(np.zeros((2, 4, 8), "float32"))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    out = ops.convert_to_numpy(ops.cast(out, "float32"))
    np.testing.assert_allclose(out[0], reference_pe(4, 8), atol=1e-2)


def test_relative_offset_is_a_linear_map():
    # §3.5: PE(pos + k) is a linear (rotation) function of PE(pos) for a fixed k.
    d, k = 8, 3
    table = ops.convert_to_numpy(sinusoidal_table(20, d)).astype("float64")
    for i in range(d // 2):
        w = 1 / 10000 ** (2 * i / d)
        rotation = np.array([[math.cos(k * w), -math.sin(k * w)],
                             [math.sin(k * w), math.cos(k * w)]])
        pair = table[:, 2 * i:2 * i + 2]  # (T, 2) = [sin, cos]
        np.testing.assert_allclose(pair[:-k] @ rotation, pair[k:], atol=1e-5)


def test_invalid_max_wavelength():
    with pytest.raises(ValueError, match="max_wavelength=1"):
        SinusoidalPositionEncoding(max_wavelength=1)


def test_layer_test_case():
    run_layer_test(
        SinusoidalPositionEncoding,
        {"max_wavelength": 10000},
        np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32"),
        expected_output_shape=(2, 4, 8),
        run_fit=False,
    )


def test_in_a_model_added_to_embeddings():
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(10, 6)(tokens)
    x = x + SinusoidalPositionEncoding()(x)
    model = keras.Model(tokens, x)
    ids = np.array([[1, 2, 3], [4, 5, 6]])
    emb = ops.convert_to_numpy(model.layers[1](ids))
    np.testing.assert_allclose(model.predict(ids, verbose=0), emb + reference_pe(3, 6),
                               atol=1e-5)
