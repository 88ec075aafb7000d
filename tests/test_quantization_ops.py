"""`quantization_ops` / `QatBert(float_ops=...)`: which ops an int8 budget can move to float,
and what a float op leaves int8."""

import numpy as np
import pytest

from keras_attn.quantization.qat_bert import QatBert
from keras_attn.quantization.quantization_ops import op_weight_count
from keras_attn.quantization.quantization_ops import quantization_ops

pytestmark = pytest.mark.tensorflow


def _model(**kwargs):
    return QatBert(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8,
                   intermediate_dim=16, max_sequence_length=8, num_outputs=3,
                   float_residual=True, **kwargs)


def test_the_ops_in_graph_order():
    assert quantization_ops(1) == [
        "embeddings", "transformer_layer_0/qkv", "transformer_layer_0/attention_output",
        "transformer_layer_0/intermediate", "transformer_layer_0/feedforward_output",
        "pooled_dense", "logits"]
    assert "pooled_dense" not in quantization_ops(2, "token_classification")


def test_a_float_op_switches_off_its_input_and_output_roundings_only():
    model = _model(float_ops=["transformer_layer_1/intermediate", "transformer_layer_0/qkv"])
    assert model.float_ops == ("transformer_layer_0/qkv", "transformer_layer_1/intermediate")
    block0, block1 = model.get_layer("transformer_layer_0"), model.get_layer("transformer_layer_1")
    assert block0.float_matmuls == ("qkv",) and block1.float_matmuls == ("intermediate",)
    off = lambda block: {n for n, q in block.quantizers.items() if not q.quantize}
    residual = {"attention_residual_quantizer", "feedforward_residual_quantizer"}
    assert off(block0) == residual | {"qkv_quantizer"}
    assert off(block1) == residual | {"attention_layer_norm_quantizer", "intermediate_quantizer"}
    # The embeddings round their output only for an int8 first matmul (block 0's is float).
    assert not model.get_layer("embeddings").quantizers["layer_norm_quantizer"].quantize
    assert block0.quantizers["feedforward_layer_norm_quantizer"].quantize  # block 1's qkv
    # The config carries the choice (the conversion reads the saved model).
    assert QatBert.from_config(model.get_config()).float_ops == model.float_ops


def test_an_unknown_op_is_named():
    with pytest.raises(ValueError, match="`float_ops` names an op the model does not have: "
                                         "'transformer_layer_5/qkv'"):
        _model(float_ops=["transformer_layer_5/qkv"])
    with pytest.raises(ValueError, match="`float_matmuls` must be a list of"):
        from keras_attn.quantization.qat_encoder_block import QatEncoderBlock
        QatEncoderBlock(num_heads=2, intermediate_dim=8, float_matmuls=["softmax"])


def test_every_op_float_is_the_float_model():
    model = _model()
    x = {"token_ids": np.array([[2, 5, 9, 3, 0]]), "segment_ids": np.zeros((1, 5), "int32"),
         "padding_mask": np.array([[1, 1, 1, 1, 0]])}
    model.calibrate([x])
    every = model.with_float_ops(model.quantization_ops())
    assert not any(q.quantize for q in every.activation_quantizers)
    np.testing.assert_array_equal(np.asarray(every(x)),
                                  np.asarray(model.with_quantization(False)(x)))


def test_the_weights_an_op_stores():
    model = _model(feedforward_float_channels=2)
    assert op_weight_count(model, "embeddings") == 30 * 8 + 2 * 8 + 8 * 8
    assert op_weight_count(model, "transformer_layer_0/qkv") == 8 * 24
    assert op_weight_count(model, "transformer_layer_1/intermediate") == 8 * (16 - 2)
    assert op_weight_count(model, "logits") == 8 * 3
