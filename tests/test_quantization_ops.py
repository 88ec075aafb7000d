"""`check_float_ops` / `QuantizedModel.with_float_ops`: which ops an int8 budget can move to
float, and what a float op leaves int8."""

import numpy as np
import pytest

from keras_attn.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_attn.models import BertBackbone
from keras_attn.models import BertClassifier
from keras_attn.quantization import QuantizedModel
from keras_attn.quantization.model_queries import activation_quantizers

pytestmark = pytest.mark.tensorflow

X = {"token_ids": np.array([[2, 5, 9, 3, 0]]), "segment_ids": np.zeros((1, 5), "int32"),
     "padding_mask": np.array([[1, 1, 1, 1, 0]])}


def _model(**kwargs):
    backbone = BertBackbone(vocabulary_size=30, num_layers=2, num_heads=2, hidden_dim=8,
                            intermediate_dim=16, max_sequence_length=8)
    return QuantizedModel.calibrated(BertClassifier(backbone, num_classes=3), [X],
                                     float_residual=True, **kwargs)


def _layers(model):
    return {layer.name: layer for layer in model.model._flatten_layers(include_self=False)}


def test_the_ops_in_graph_order():
    blocks = [f"transformer_layer_{i}/{m}" for i in range(2)
              for m in ("qkv", "attention_output", "intermediate", "feedforward_output")]
    assert _model().quantization_ops() == ["embeddings", *blocks, "pooled_dense", "logits"]


def test_a_float_op_switches_off_its_input_and_output_roundings_only():
    model = _model().with_float_ops(["transformer_layer_1/intermediate",
                                     "transformer_layer_0/qkv"])
    assert model.float_ops == ("transformer_layer_0/qkv", "transformer_layer_1/intermediate")
    layers = _layers(model)
    block0, block1 = layers["transformer_layer_0"], layers["transformer_layer_1"]
    assert block0.float_matmuls == ("qkv",) and block1.float_matmuls == ("intermediate",)
    off = lambda block: {n for n, q in block.quantizers.items() if not q.quantize}
    # The float residual stream and the block's output (the next matmul rounds its input).
    floats = {"attention_residual_quantizer", "feedforward_residual_quantizer",
              "feedforward_layer_norm_quantizer"}
    assert off(block0) == floats | {"qkv_quantizer"}
    assert off(block1) == floats | {"attention_layer_norm_quantizer", "intermediate_quantizer"}
    # The other matmuls of both blocks still round their inputs and outputs.
    for block in (block0, block1):
        assert block.quantizers["attention_output_quantizer"].quantize
        assert block.quantizers["feedforward_output_quantizer"].quantize


def test_an_unknown_op_is_named():
    with pytest.raises(ValueError, match="`float_ops` names an op the model does not have: "
                                         "'transformer_layer_5/qkv'"):
        _model(float_ops=["transformer_layer_5/qkv"])
    with pytest.raises(ValueError, match="`float_matmuls` must be a list of"):
        TransformerEncoderBlock(num_heads=2, intermediate_dim=8,
                                quantization={"float_matmuls": ["softmax"]})


def test_every_op_float_is_the_float_model():
    model = _model()
    every = model.with_float_ops(model.quantization_ops())
    rounding = [q.path for q in activation_quantizers(every.model) if q.quantize]
    # Only the table lookups' sums stay rounded: they are no op of the budget's.
    assert all("embeddings" in path for path in rounding), rounding
    np.testing.assert_allclose(np.asarray(every(X)),
                               np.asarray(model.with_quantization(False)(X)), atol=1e-5)


def test_the_weights_an_op_stores():
    model = _model(feedforward_float_channels=2)
    assert model.op_weight_count("embeddings") == 30 * 8 + 2 * 8 + 8 * 8
    assert model.op_weight_count("transformer_layer_0/qkv") == 8 * 24
    assert model.op_weight_count("transformer_layer_1/intermediate") == 8 * (16 - 2)
    assert model.op_weight_count("logits") == 8 * 3
