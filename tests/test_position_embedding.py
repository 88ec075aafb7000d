import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.position_embedding import PositionEmbedding
from tests.layer_test_case import run_layer_test

TABLE = np.arange(8 * 3, dtype="float32").reshape(8, 3) / 10.0  # row p = [3p, 3p+1, 3p+2]/10


def _layer_with_known_table():
    layer = PositionEmbedding(sequence_length=8)
    layer.build((None, None, 3))
    layer.set_weights([TABLE])
    return layer


def test_known_weights_give_exact_rows():
    layer = _layer_with_known_table()
    out = ops.convert_to_numpy(layer(np.zeros((2, 5, 3), "float32")))
    assert out.shape == (2, 5, 3)
    np.testing.assert_array_equal(out[0], TABLE[:5])
    np.testing.assert_array_equal(out[1], TABLE[:5])


def test_start_index_slices_the_table():
    layer = _layer_with_known_table()
    for k in (0, 2, 5):
        out = ops.convert_to_numpy(layer(np.zeros((1, 3, 3), "float32"), start_index=k))
        np.testing.assert_array_equal(out[0], TABLE[k:k + 3])
    out = layer(np.zeros((1, 1, 3), "float32"), start_index=ops.convert_to_tensor(7, "int32"))
    np.testing.assert_array_equal(ops.convert_to_numpy(out)[0], TABLE[7:8])


def test_weight_name_and_shape():
    layer = PositionEmbedding(sequence_length=8)
    layer(np.zeros((1, 2, 3), "float32"))
    assert [w.name for w in layer.weights] == ["embeddings"]
    assert tuple(layer.embeddings.shape) == (8, 3)


def test_too_long_sequence_is_an_error():
    layer = PositionEmbedding(sequence_length=4)
    with pytest.raises(ValueError, match="sequence_length=4"):
        layer(np.zeros((1, 5, 3), "float32"))
    with pytest.raises(ValueError, match="start_index=2"):
        layer(np.zeros((1, 3, 3), "float32"), start_index=2)


def test_invalid_sequence_length():
    with pytest.raises(ValueError, match="Received: sequence_length=0"):
        PositionEmbedding(sequence_length=0)


def test_initializer_round_trip():
    layer = PositionEmbedding(sequence_length=4, initializer=keras.initializers.Constant(0.5))
    out = ops.convert_to_numpy(layer(np.zeros((1, 2, 3), "float32")))
    np.testing.assert_array_equal(out, np.full((1, 2, 3), 0.5))
    clone = PositionEmbedding.from_config(layer.get_config())
    np.testing.assert_array_equal(ops.convert_to_numpy(clone(np.zeros((1, 2, 3)))), out)


def test_gradient_reaches_only_used_rows():
    layer = PositionEmbedding(sequence_length=6)
    model = keras.Sequential([keras.Input((3, 2)), layer])
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")
    before = ops.convert_to_numpy(layer.embeddings).copy()
    model.fit(np.zeros((2, 3, 2)), np.ones((2, 3, 2)), epochs=1, verbose=0)
    after = ops.convert_to_numpy(layer.embeddings)
    assert not np.allclose(before[:3], after[:3])
    np.testing.assert_array_equal(before[3:], after[3:])


def test_layer_test_case():
    run_layer_test(
        PositionEmbedding,
        {"sequence_length": 6},
        np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32"),
        expected_output_shape=(2, 4, 8),
    )
