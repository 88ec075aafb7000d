"""The int8 layout of an encoder block (`EncoderInt8Layout`): `TransformerEncoderBlock`'s
`quantization` setting, on the float block's own weights."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_attn.layers.transformer_decoder_block import TransformerDecoderBlock
from keras_attn.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_attn.layers.xlnet_block import XLNetBlock

H, F, T = 8, 16, 5
MASK = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])


def float_block(fused_qkv, seed=0, norm_first=False):
    block = TransformerEncoderBlock(2, F, activation="gelu", fused_qkv=fused_qkv,
                                    layer_norm_epsilon=1e-12, norm_first=norm_first)
    block.build((None, None, H))
    rng = np.random.default_rng(seed)
    for variable in block.trainable_weights:
        variable.assign(rng.normal(scale=0.5, size=variable.shape))
    return block


def with_layout(block, **settings):
    """A copy of the float `block` with the int8 layout and the block's weights."""
    quantized = type(block).from_config({**block.get_config(), "quantization": settings})
    quantized.build((None, None, H))
    targets = {v.path.split("/", 1)[1]: v for v in quantized.weights}
    for variable in block.weights:
        targets[variable.path.split("/", 1)[1]].assign(variable)
    return quantized


def inputs(seed=1):
    return np.random.default_rng(seed).normal(size=(2, T, H)).astype("float32")


@pytest.mark.parametrize("fused_qkv", [True, False])
def test_the_layout_without_rounding_is_the_float_block(fused_qkv):
    """`quantize=False` runs the layout's graph (one (H, 3H) matmul, heads by reshape) on
    the float weights: the float block's function, fused or separate Q/K/V kernels."""
    block = float_block(fused_qkv)
    expected = ops.convert_to_numpy(block(inputs(), padding_mask=MASK))
    got = ops.convert_to_numpy(with_layout(block, quantize=False)(inputs(), padding_mask=MASK))
    np.testing.assert_allclose(got, expected, atol=1e-5)
    # Only the first rows as queries, as the float block does.
    first = with_layout(block, quantize=False)(inputs(), padding_mask=MASK, query_length=1)
    np.testing.assert_allclose(ops.convert_to_numpy(first), expected[:, :1], atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_causal_mask_and_the_pre_ln_order_compute_the_float_block(norm_first):
    """Without rounding, the layout of a pre-LN block (GPT's) and the causal mask are the
    float block's; with rounding, a later token never changes an earlier output."""
    block = float_block(True, norm_first=norm_first)
    expected = ops.convert_to_numpy(block(inputs(), padding_mask=MASK, use_causal_mask=True))
    got = with_layout(block, quantize=False)(inputs(), padding_mask=MASK, use_causal_mask=True)
    np.testing.assert_allclose(ops.convert_to_numpy(got), expected, atol=1e-5)
    quantized = with_layout(block)
    quantized(inputs(), padding_mask=MASK, use_causal_mask=True, training=True)
    changed = inputs().copy()
    changed[:, 3:] += 1.0
    before, after = (ops.convert_to_numpy(quantized(x, use_causal_mask=True))
                     for x in (inputs(), changed))
    np.testing.assert_array_equal(before[:, :3], after[:, :3])
    assert not np.allclose(before[:, 3:], after[:, 3:])


def test_the_output_is_on_its_int8_grid_and_the_input_rounded_when_asked():
    block = with_layout(float_block(True), quantize_input=True)
    block(inputs(), padding_mask=MASK, training=True)
    output = ops.convert_to_numpy(block(inputs(), padding_mask=MASK))
    quantizer = block.quantizers["feedforward_layer_norm_quantizer"]
    # Fake quantization nudges the range so that 0 is a code: the grid is that of the
    # step, from the lowest output.
    codes = (output - output.min()) / float(quantizer.step())
    np.testing.assert_allclose(codes, np.round(codes), atol=2e-3)
    assert len(np.unique(np.round(codes))) > 20  # not a constant
    assert float(block.input_quantizer.max_value.numpy()) == pytest.approx(inputs().max())
    float_output = ops.convert_to_numpy(
        with_layout(float_block(True), quantize=False)(inputs(), padding_mask=MASK))
    assert not np.allclose(output, float_output, atol=1e-3)  # it did round


def test_qat_fits_and_the_keras_file_keeps_layout_and_ranges(tmp_path):
    """A model of quantized blocks trains with `fit` (the straight-through estimator:
    weights move, ranges follow) and comes back from `.keras` computing the same."""
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).normal(size=(64, T, H)).astype("float32")
    y = (x[:, 0, 0] > 0).astype("int32")
    features = keras.Input((T, H))
    hidden = TransformerEncoderBlock(2, F, quantization={"quantize_input": True})(features)
    model = keras.Model(features, keras.layers.Dense(2)(hidden[:, 0]))
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    block = model.layers[1]
    kernel = ops.convert_to_numpy(block.feedforward_intermediate_dense.kernel).copy()
    history = model.fit(x, y, epochs=8, batch_size=16, verbose=0).history["loss"]
    assert history[-1] < 0.7 * history[0], history
    assert not np.allclose(ops.convert_to_numpy(block.feedforward_intermediate_dense.kernel),
                           kernel)
    assert float(block.quantizers["qkv_quantizer"].max_value.numpy()) > 0
    path = tmp_path / "qat.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.layers[1].quantization == block.int8_layout_config()
    np.testing.assert_allclose(ops.convert_to_numpy(loaded(x[:4])),
                               ops.convert_to_numpy(model(x[:4])), atol=1e-6)


@pytest.mark.parametrize("kwargs, call, match", [
    (dict(quantization={"float_residuals": True}), {}, "Unknown int8 layout setting"),
    (dict(quantization="int8"), {}, "must be a dict"),
    (dict(quantization={}, norm_first=True), dict(query_length=1), "query_length in a pre"),
    (dict(quantization={"quantize_input": True}, norm_first=True), {}, "residual stream"),
    (dict(quantization={}), dict(attention_mask=np.ones((2, T, T), bool)),
     "padding mask and the causal mask only.*attention_mask"),
    (dict(quantization={"feedforward_float_channels": 2}), {}, "needs `float_residual"),
    (dict(quantization={}, key_dim=3), {}, "key_dim \\* num_heads"),
])
def test_layout_errors_name_the_setting(kwargs, call, match):
    with pytest.raises(ValueError, match=match):
        block = TransformerEncoderBlock(2, F, **kwargs)
        block(inputs(), **call)


def float_decoder_block(norm_first, fused_qkv, cross):
    """A float `TransformerDecoderBlock` with random weights (cross-attention if `cross`)."""
    block = TransformerDecoderBlock(2, F, norm_first=norm_first, fused_qkv=fused_qkv,
                                    activation="gelu")
    block.build((None, None, H), (None, None, H) if cross else None)
    rng = np.random.default_rng(0)
    for variable in block.trainable_weights:
        variable.assign(rng.normal(scale=0.5, size=variable.shape))
    return block


def decoder_with_layout(block, cross, **settings):
    quantized = TransformerDecoderBlock.from_config(
        {**block.get_config(), "quantization": settings})
    quantized.build((None, None, H), (None, None, H) if cross else None)
    targets = {v.path.split("/", 1)[1]: v for v in quantized.weights}
    for variable in block.weights:
        targets[variable.path.split("/", 1)[1]].assign(variable)
    return quantized


ENCODER = np.random.default_rng(2).normal(size=(2, 7, H)).astype("float32")
ENCODER_MASK = np.array([[1] * 7, [1] * 4 + [0] * 3])


@pytest.mark.parametrize("norm_first, fused_qkv, cross", [
    (True, True, False), (False, False, True), (True, True, True), (False, True, True)])
def test_a_decoder_block_has_the_int8_layout_with_its_caches(norm_first, fused_qkv, cross):
    """`TransformerDecoderBlock(quantization=...)`, decoder-only (GPT's) or with
    cross-attention (the translation Transformer's), post- or pre-LN: without rounding
    the float block's function; rounded, a step-by-step decoding with the caches gives
    the whole sequence's outputs exactly (the caches hold the int8 keys and values), and
    the cross cache is the one `compute_cross_attention_cache` gives."""
    block = float_decoder_block(norm_first, fused_qkv, cross)
    encoder = (ENCODER,) if cross else ()
    masks = dict(encoder_padding_mask=ENCODER_MASK) if cross else {}
    expected = ops.convert_to_numpy(block(inputs(), *encoder, **masks))
    plain = decoder_with_layout(block, cross, quantize=False)
    np.testing.assert_allclose(ops.convert_to_numpy(plain(inputs(), *encoder, **masks)),
                               expected, atol=1e-5)
    quantized = decoder_with_layout(block, cross)
    quantized(inputs(), *encoder, **masks, training=True)
    whole = ops.convert_to_numpy(quantized(inputs(), *encoder, **masks))
    assert not np.allclose(whole, expected, atol=1e-3)  # it rounds
    cache, cross_cache, steps = np.zeros((2, 2, T, 2, H // 2), "float32"), None, []
    for t in range(T):
        result = quantized(inputs()[:, t:t + 1], *encoder, **masks,
                           self_attention_cache=cache, self_attention_cache_update_index=t)
        output, cache, *rest = result
        cross_cache = rest[0] if rest else None
        steps.append(ops.convert_to_numpy(output))
    np.testing.assert_array_equal(np.concatenate(steps, axis=1), whole)
    if cross:
        np.testing.assert_array_equal(
            ops.convert_to_numpy(cross_cache),
            ops.convert_to_numpy(quantized.compute_cross_attention_cache(ENCODER)))
        assert len(quantized.int8_matmuls()) == 7
    else:
        assert quantized.int8_matmuls() == (
            "qkv", "attention_output", "intermediate", "feedforward_output")


def test_the_cross_attention_matmuls_stay_float_when_asked(tmp_path):
    """`float_matmuls` names the cross-attention's matmuls too: their input and output
    quantizers only track ranges; a block without cross-attention refuses them. The
    layout and its ranges come back from `.keras`."""
    block = decoder_with_layout(float_decoder_block(False, False, True), True,
                                float_matmuls=["cross_key_value"])
    assert not block.quantizers["encoder_quantizer"].quantize
    assert not block.quantizers["cross_key_value_quantizer"].quantize
    assert block.quantizers["cross_query_quantizer"].quantize
    assert block.quantizers["attention_layer_norm_quantizer"].quantize
    decoder, encoder = keras.Input((T, H)), keras.Input((7, H))
    model = keras.Model([decoder, encoder], block(decoder, encoder))
    model([inputs(), ENCODER], training=True)
    path = tmp_path / "cross.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(ops.convert_to_numpy(loaded([inputs(), ENCODER])),
                               ops.convert_to_numpy(model([inputs(), ENCODER])), atol=1e-6)
    with pytest.raises(ValueError, match="no cross-attention.*cross_key_value"):
        TransformerDecoderBlock(2, F, quantization={"float_matmuls": ["cross_key_value"]})(
            inputs())
    with pytest.raises(ValueError, match="padding mask and the causal mask only"):
        decoder_with_layout(float_decoder_block(True, True, False), False)(
            inputs(), self_attention_mask=np.ones((2, T, T), bool))


def test_an_xlnet_block_has_the_int8_layout_with_its_relative_terms():
    """XLNet's content stream in the layout: BERT's post-LN block with the relative
    position and segment terms and the biases u, v, b (all random here) added to the
    scores; without rounding it is the float block (padding, segments, each query seeing
    itself), with and without segments; the query stream and the memory are refused."""
    block = XLNetBlock(2, F, name="xlnet")
    block.build((None, None, H))
    rng = np.random.default_rng(0)
    for variable in block.trainable_weights:
        variable.assign(rng.normal(scale=0.5, size=variable.shape))
    visible = np.repeat(MASK[:, None, :].astype(bool), T, axis=1)  # (B, T, T)
    segments = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]])
    layout = with_layout(block, quantize=False)
    for segment_ids in (segments, None):
        expected = block(inputs(), attention_mask=visible, segment_ids=segment_ids)
        got = layout(inputs(), attention_mask=visible, segment_ids=segment_ids)
        np.testing.assert_allclose(ops.convert_to_numpy(got), ops.convert_to_numpy(expected),
                                   atol=1e-5)
    assert XLNetBlock.from_config(layout.get_config()).quantization == \
        layout.int8_layout_config()
    quantized = with_layout(block, float_residual=True)
    quantized(inputs(), attention_mask=visible, segment_ids=segments, training=True)
    rounded = ops.convert_to_numpy(
        quantized(inputs(), attention_mask=visible, segment_ids=segments))
    codes = (rounded - rounded.min()) / float(quantized.output_quantizer().step())
    np.testing.assert_allclose(codes, np.round(codes), atol=2e-3)  # on its int8 grid
    expected = block(inputs(), attention_mask=visible, segment_ids=segments)
    error = np.abs(rounded - ops.convert_to_numpy(expected))
    assert 0 < error.mean() < 0.02, error.mean()  # measured 0.0067
    with pytest.raises(ValueError, match="query_stream, memory"):
        quantized(inputs(), query_stream=inputs(), memory=inputs())
