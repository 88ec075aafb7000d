"""Tests of `keras_attn.quantization.quantized_model.QuantizedModel` (the variants an int8
budget makes of any `quantize_model` copy) and of the budget's search on it
(`quantization_budget`: sensitivity order, costly ops last, the bytes of each step)."""

import keras
import numpy as np
import pytest

from keras_attn.layers import TokenAndPositionEmbedding
from keras_attn.layers import TransformerEncoderBlock
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.quantization_budget import cost_order
from keras_attn.quantization.quantization_budget import quantization_budget
from keras_attn.quantization.quantization_sensitivity import quantization_sensitivity
from keras_attn.quantization.quantized_model import QuantizedModel

pytestmark = pytest.mark.tensorflow

RECIPE = dict(float_residual=True, feedforward_float_channels=4)


def encoder_model(vocabulary_size=60, length=10):
    """Embeddings, one post-LN encoder block, a Dense head on the first position."""
    token_ids = keras.Input((length,), dtype="int32", name="token_ids")
    x = TokenAndPositionEmbedding(vocabulary_size=vocabulary_size, sequence_length=length,
                                  embedding_dim=16, name="embeddings")(token_ids)
    x = TransformerEncoderBlock(num_heads=2, intermediate_dim=32, name="block")(x)
    return keras.Model(token_ids, keras.layers.Dense(3, name="head")(x[:, 0]))


@pytest.fixture(scope="module")
def calibrated():
    keras.utils.set_random_seed(0)
    model = encoder_model()
    ids = np.random.default_rng(0).integers(1, 60, (64, 10)).astype("int32")
    batches = [ids[:32], ids[32:]]
    return model, batches, QuantizedModel.calibrated(model, batches, **RECIPE)


def outputs(model, x):
    return keras.ops.convert_to_numpy(model(x, training=False))


def ranges(model):
    return {q.path: (float(q.min_value.numpy()), float(q.max_value.numpy()))
            for q in activation_quantizers(model) if float(q.initialized.numpy()) > 0.5}


def test_a_variant_keeps_every_weight_and_range_and_moves_only_its_ops(calibrated):
    model, batches, quantized = calibrated
    same = quantized.with_float_ops([])
    np.testing.assert_array_equal(outputs(same, batches[0]), outputs(quantized, batches[0]))
    moved = quantized.with_float_ops(["block/intermediate", "head"])
    assert moved.float_ops == ("block/intermediate", "head")
    assert moved.model.get_layer("head").quantize is False
    assert moved.model.get_layer("block").float_matmuls == ("intermediate",)
    # Every range the recipe calibrated is kept as it was (none calibrated again).
    before = ranges(quantized.model)
    after = ranges(moved.model)
    assert {path: after[path] for path in before if path in after} == {
        path: value for path, value in before.items() if path in after}
    # The channel order (widest last) and the weights are the recipe's.
    np.testing.assert_array_equal(
        moved.model.get_layer("block").feedforward_channel_order.numpy(),
        quantized.model.get_layer("block").feedforward_channel_order.numpy())
    assert not np.array_equal(outputs(moved, batches[0]), outputs(quantized, batches[0]))
    # With every op float it is the float model.
    every = quantized.with_float_ops(quantized.quantization_ops())
    np.testing.assert_allclose(outputs(every, batches[0]), outputs(model, batches[0]),
                               atol=1e-5)
    np.testing.assert_allclose(outputs(quantized.with_quantization(False), batches[0]),
                               outputs(model, batches[0]), atol=1e-5)


def test_op_weight_counts_are_the_int8_matrices(calibrated):
    _, _, quantized = calibrated
    d, f, k = 16, 32, RECIPE["feedforward_float_channels"]
    # token (60) and position (10) tables; the LayerNorm's vectors are float anyway
    assert quantized.op_weight_count("embeddings") == (60 + 10) * d
    assert quantized.op_weight_count("block/qkv") == d * 3 * d
    assert quantized.op_weight_count("block/attention_output") == d * d
    assert quantized.op_weight_count("block/intermediate") == d * f - k * d
    assert quantized.op_weight_count("block/feedforward_output") == f * d - k * d
    assert quantized.op_weight_count("head") == d * 3


def test_the_budget_moves_sensitive_ops_and_the_costly_table_last():
    """A score that rises with each op moved: the search moves ops in the sensitivity
    order, except the embedding table (most of the weights), tried after the others; each
    step records the bytes it adds (3 per weight)."""
    keras.utils.set_random_seed(1)
    model = encoder_model(vocabulary_size=4000)
    ids = np.random.default_rng(1).integers(1, 4000, (32, 10)).astype("int32")
    quantized = QuantizedModel.calibrated(model, [ids], **RECIPE)
    rows = quantization_sensitivity(quantized, [ids])
    order = [row["op"] for row in rows[1:]]
    rows = [rows[0], {**rows[1], "op": "embeddings"},
            *[row for row in rows[1:] if row["op"] != "embeddings"]]
    assert cost_order(quantized, ["embeddings", "head"]) == ["head", "embeddings"]

    def score(candidate):  # float model 1.0; two ops moved reach it
        if not hasattr(candidate, "float_ops"):
            return 1.0
        return 0.9 + 0.05 * min(len(candidate.float_ops), 2)

    chosen, record = quantization_budget(quantized, rows, score, max_drop=0.0)
    cheap = [op for op in order if op != "embeddings"]
    assert list(chosen.float_ops) == sorted(cheap[:2], key=quantized.quantization_ops().index)
    assert [step["float_ops"][-1] for step in record["steps"][1:]] == cheap[:2]
    assert [step["size_cost_bytes"] for step in record["steps"]] == [
        0, 3 * quantized.op_weight_count(cheap[0]),
        3 * sum(quantized.op_weight_count(op) for op in cheap[:2])]
    assert record["within_budget"] and record["size_cost_bytes"] == record["steps"][-1][
        "size_cost_bytes"]
