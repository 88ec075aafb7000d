import math

import numpy as np
import pytest
from keras import ops

from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from tests.layer_test_case import run_layer_test
from tests.numpy_reference import fake_quant_reference
from tests.numpy_reference import numpy_rows

IDS = np.array([[5, 6, 7, 0], [1, 2, 3, 4]], "int32")
SEGMENTS = np.array([[0, 0, 1, 1], [0, 1, 1, 1]], "int32")


def test_bert_input_is_the_sum_of_three_embeddings():
    layer = TokenAndPositionEmbedding(10, 6, 8, num_segments=2)
    out = ops.convert_to_numpy(layer(IDS, segment_ids=SEGMENTS))
    tokens = ops.convert_to_numpy(layer.token_embedding.embeddings)
    segments = ops.convert_to_numpy(layer.segment_embedding.embeddings)
    positions = ops.convert_to_numpy(layer.position_embedding.embeddings)
    expected = tokens[IDS] + segments[SEGMENTS] + positions[None, :4]
    np.testing.assert_allclose(out, expected, atol=1e-6)
    # No segment ids: every token is sentence A.
    np.testing.assert_allclose(
        ops.convert_to_numpy(layer(IDS)), tokens[IDS] + segments[0] + positions[None, :4],
        atol=1e-6,
    )


def test_transformer_input_scales_tokens_and_adds_sinusoids():
    layer = TokenAndPositionEmbedding(
        10, None, 4, position_encoding="sinusoidal", scale_token_embeddings=True
    )
    out = ops.convert_to_numpy(layer(IDS, start_index=3))
    tokens = ops.convert_to_numpy(layer.token_embedding.embeddings)
    pos = np.arange(3, 7)[:, None]
    # The worked d_model=4 example of the notes: [sin(p), cos(p), sin(p/100), cos(p/100)].
    pe = np.concatenate([np.sin(pos), np.cos(pos), np.sin(pos / 100), np.cos(pos / 100)], 1)
    np.testing.assert_allclose(out, tokens[IDS] * math.sqrt(4) + pe[None], atol=1e-5)


def test_mask_zero_feeds_attention_padding():
    embed = TokenAndPositionEmbedding(10, 6, 8, mask_zero=True)
    attention = MultiHeadAttention(num_heads=2, key_dim=4)
    x = embed(IDS)
    np.testing.assert_array_equal(ops.convert_to_numpy(embed.compute_mask(IDS)), IDS != 0)
    implicit = ops.convert_to_numpy(attention(x))
    explicit = ops.convert_to_numpy(attention(x, padding_mask=IDS != 0))
    np.testing.assert_allclose(implicit, explicit, atol=1e-6)


@pytest.mark.parametrize(
    "kwargs, inputs",
    [
        ({"num_segments": 2}, {"token_ids": IDS, "segment_ids": SEGMENTS}),
        ({"position_encoding": "sinusoidal", "scale_token_embeddings": True}, IDS),
        ({"mask_zero": True}, IDS),
    ],
)
def test_shared_layer_checks(kwargs, inputs):
    run_layer_test(
        TokenAndPositionEmbedding, {"vocabulary_size": 10, "sequence_length": 6,
                                    "embedding_dim": 8, **kwargs},
        inputs, expected_output_shape=(2, 4, 8),
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"vocabulary_size": 0}, "Received: vocabulary_size=0"),
        ({"embedding_dim": -1}, "Received: embedding_dim=-1"),
        ({"position_encoding": "absolute"}, "Received: position_encoding='absolute'"),
        ({"sequence_length": None}, "Received: sequence_length=None"),
        ({"num_segments": -1}, "Received: num_segments=-1"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"vocabulary_size": 10, "sequence_length": 6, "embedding_dim": 8, **kwargs}
    with pytest.raises(ValueError, match=message):
        TokenAndPositionEmbedding(**args)


def test_segment_ids_without_segment_table():
    with pytest.raises(ValueError, match="num_segments=2"):
        TokenAndPositionEmbedding(10, 6, 8)(IDS, segment_ids=SEGMENTS)


def test_quantization_rounds_each_table_and_sum_as_the_int8_file_does():
    """With `quantization`, the tables are the per-tensor symmetric int8 rows (TFLite's
    GATHER; learned positions too) and each sum is fake-quantized at its calibrated range
    (NumPy references); the weights are the float layer's, `quantize=False` is the float
    layer, and the config round-trips."""
    layer = TokenAndPositionEmbedding(10, 6, 8, num_segments=2,
                                      quantization={"decay": 0.5})
    layer(IDS, segment_ids=SEGMENTS, training=True)  # first call: the ranges are set
    out = ops.convert_to_numpy(layer(IDS, segment_ids=SEGMENTS))
    tokens, segments, positions = (ops.convert_to_numpy(table) for table in (
        layer.token_embedding.embeddings, layer.segment_embedding.embeddings,
        layer.position_embedding.embeddings))

    def rounded(name, x):
        quantizer = layer.quantizers[name]
        return fake_quant_reference(x, float(quantizer.min_value.numpy()),
                                    float(quantizer.max_value.numpy()))

    summed = rounded("token_segment_quantizer",
                     numpy_rows(tokens, IDS) + numpy_rows(segments, SEGMENTS))
    expected = rounded("output_quantizer", summed + numpy_rows(positions, np.arange(4))[None])
    np.testing.assert_allclose(out, expected, atol=1e-5)
    float_sum = tokens[IDS] + segments[SEGMENTS] + positions[None, :4]
    assert not np.allclose(out, float_sum, atol=1e-4)  # it did round
    plain = TokenAndPositionEmbedding.from_config(
        {**layer.get_config(), "quantization": {"quantize": False}})
    plain.build(IDS.shape)
    plain.set_weights(layer.get_weights())
    np.testing.assert_allclose(ops.convert_to_numpy(plain(IDS, segment_ids=SEGMENTS)),
                               float_sum, atol=1e-6)
    assert TokenAndPositionEmbedding.from_config(layer.get_config()).quantization == {
        "quantize": True, "decay": 0.5, "quantize_output": True}
    with pytest.raises(ValueError, match="int8 settings"):
        TokenAndPositionEmbedding(10, 6, 8, quantization={"float_residual": True})
