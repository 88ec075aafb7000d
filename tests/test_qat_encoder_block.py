"""`QatEncoderBlock`'s float feed-forward channels (LLM.int8()'s mixed-precision
decomposition); the rest of the block is tested through `QatBert` in test_qat_bert.py."""

import keras
import numpy as np
import pytest

from keras_attn.layers.feedforward_float_channels import ChannelRanges
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_classifier import BertClassifier
from keras_attn.quantization.qat_bert import QatBert
from keras_attn.quantization.qat_encoder_block import QatEncoderBlock

pytestmark = pytest.mark.tensorflow

H, F, T = 8, 16, 5


def gelu(x):
    from math import erf
    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def numpy_feedforward(y, w1, b1, w2, b2):
    """The paper's FFN(y) = W_2 GELU(W_1 y + b_1) + b_2, unquantized."""
    return gelu(y @ w1 + b1) @ w2 + b2


def float_block(float_channels, seed=0, quantize=False):
    block = QatEncoderBlock(num_heads=2, intermediate_dim=F, quantize=quantize,
                            float_residual=True, feedforward_float_channels=float_channels)
    block.build((None, None, H))
    rng = np.random.default_rng(seed)
    for variable in block.trainable_weights:
        variable.assign(rng.normal(scale=0.5, size=variable.shape))
    return block


def feedforward(block, y, training=False):
    """The block's feed-forward network alone: the sum of its parts."""
    return sum(keras.ops.convert_to_numpy(block._feedforward_part(y, p, c, q, training))
               for p, (c, q) in enumerate(block._feedforward_parts()))


def test_float_channels_and_permutations_compute_the_same_function():
    """Float channels only change the quantization: the float function is the same for
    k = 0, 1 and 5 and any channel order, and the FFN equals the paper's in NumPy."""
    x = np.random.default_rng(1).normal(size=(2, T, H)).astype("float32")
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    expected = keras.ops.convert_to_numpy(float_block(0)(x, padding_mask=mask))
    for k in (1, 5):
        block = float_block(k)
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(block(x, padding_mask=mask)), expected, atol=1e-5)
        order = np.random.default_rng(k).permutation(F)
        w1, b1 = block.intermediate_kernel.numpy(), block.intermediate_bias.numpy()
        w2 = block.feedforward_output_kernel.numpy()
        block.permute_feedforward_channels(order)
        np.testing.assert_array_equal(block.feedforward_channel_order.numpy(), order)
        np.testing.assert_array_equal(block.intermediate_kernel.numpy(), w1[:, order])
        np.testing.assert_array_equal(block.intermediate_bias.numpy(), b1[order])
        np.testing.assert_array_equal(block.feedforward_output_kernel.numpy(), w2[order])
        # Permuting again composes the orders.
        block.permute_feedforward_channels(np.arange(F)[::-1])
        np.testing.assert_array_equal(block.feedforward_channel_order.numpy(), order[::-1])
        np.testing.assert_allclose(
            keras.ops.convert_to_numpy(block(x, padding_mask=mask)), expected, atol=1e-5)
    y = np.random.default_rng(2).normal(size=(3, H)).astype("float32")
    block = float_block(5)
    want = numpy_feedforward(y, block.intermediate_kernel.numpy(),
                             block.intermediate_bias.numpy(),
                             block.feedforward_output_kernel.numpy(),
                             block.feedforward_output_bias.numpy())
    np.testing.assert_allclose(feedforward(block, y), want, atol=1e-4)


def test_quantized_block_keeps_the_last_channels_exact():
    """With quantization on, the last k channels' contribution is the float formula, and
    the int8 part is the fake-quantized FFN of the other channels (NumPy reference)."""
    k = 3
    block = float_block(k, quantize=True)
    y = np.random.default_rng(3).normal(size=(6, H)).astype("float32")
    block.quantizers["intermediate_quantizer"].calibrating = True
    block.quantizers["activation_quantizer"].calibrating = True
    block.quantizers["feedforward_output_quantizer"].calibrating = True
    int8_part, float_part = [
        keras.ops.convert_to_numpy(block._feedforward_part(y, p, c, q, False))
        for p, (c, q) in enumerate(block._feedforward_parts())]
    w1, b1 = block.intermediate_kernel.numpy(), block.intermediate_bias.numpy()
    w2, b2 = block.feedforward_output_kernel.numpy(), block.feedforward_output_bias.numpy()
    np.testing.assert_allclose(float_part, gelu(y @ w1[:, -k:] + b1[-k:]) @ w2[-k:],
                               atol=1e-5)
    exact = numpy_feedforward(y, w1[:, :-k], b1[:-k], w2[:-k], b2)
    step = float(block.quantizers["feedforward_output_quantizer"].step())
    error = np.abs(int8_part - exact).max()
    assert 0 < error < 3 * step + 0.05 * np.abs(exact).max(), (error, step)


def outlier_classifier():
    """A classifier whose first block has one wide feed-forward channel (GELU outputs
    ~20x the others), as fine-tuned MiniLM's first block has."""
    keras.utils.set_random_seed(0)
    backbone = BertBackbone(vocabulary_size=60, num_layers=2, num_heads=2, hidden_dim=16,
                            intermediate_dim=32, max_sequence_length=12)
    model = BertClassifier(backbone, num_classes=3)
    logits = model.get_layer("logits")
    logits.kernel.assign(logits.kernel.numpy() * 50)
    dense = backbone.get_layer("transformer_layer_0").feedforward_intermediate_dense
    kernel, bias = dense.kernel.numpy(), dense.bias.numpy()
    kernel[:, 7] *= 20.0
    bias[7] = 10.0
    dense.kernel.assign(kernel)
    dense.bias.assign(bias)
    return model


def batch(seed, size=4):
    rng = np.random.default_rng(seed)
    return {"token_ids": rng.integers(1, 60, (size, 12)).astype("int32"),
            "segment_ids": np.zeros((size, 12), "int32"),
            "padding_mask": np.ones((size, 12), "int32")}


def test_calibrate_finds_the_wide_channel_and_keeps_it_float():
    model = outlier_classifier()
    calibration = [batch(seed) for seed in range(10, 14)]
    x = batch(2, size=64)
    reference = keras.ops.convert_to_numpy(model(x))
    errors, widths = {}, {}
    for k in (0, 2):
        qat = QatBert.from_float(model, float_residual=True, feedforward_float_channels=k)
        qat.calibrate(calibration)
        errors[k] = np.abs(keras.ops.convert_to_numpy(qat(x)) - reference).max()
        block = qat.get_layer("transformer_layer_0")
        activation = block.quantizers["activation_quantizer"]
        widths[k] = float(activation.max_value.numpy() - activation.min_value.numpy())
        if not k:
            continue
        # The wide channel is stored last.
        assert block.feedforward_channel_order.numpy()[-1] == 7
        # Calibrating again keeps the order (the ranges are already set).
        order = block.feedforward_channel_order.numpy()
        qat.calibrate([batch(20)])
        np.testing.assert_array_equal(block.feedforward_channel_order.numpy(), order)
        # The float weights come back in their own order.
        restored = qat.to_float()
        for source, target in zip(model.weights, restored.weights):
            np.testing.assert_array_equal(source.numpy(), target.numpy(), err_msg=source.path)
    # Without the wide channel, the int8 GELU range is several times narrower (the
    # logits' error is dominated by the rest of this tiny model's quantization).
    assert widths[2] < 0.3 * widths[0], widths
    assert errors[2] <= 1.05 * errors[0], errors


def test_float_channels_shrink_the_feedforward_int8_error():
    """One channel ~20x wider than the others: with it in float, the fake-int8 FFN is
    several times closer to the NumPy FFN than with one int8 scale for all channels."""
    y = np.random.default_rng(4).normal(size=(64, H)).astype("float32")
    errors = {}
    for k in (0, 1):
        block = float_block(k, seed=5, quantize=True)
        kernel, bias = block.intermediate_kernel.numpy(), block.intermediate_bias.numpy()
        kernel[:, 3] *= 20.0
        bias[3] = 10.0
        block.intermediate_kernel.assign(kernel)
        block.intermediate_bias.assign(bias)
        exact = numpy_feedforward(y, kernel, bias, block.feedforward_output_kernel.numpy(),
                                  block.feedforward_output_bias.numpy())
        if k:
            block.permute_feedforward_channels([c for c in range(F) if c != 3] + [3])
        quantizers = [block.quantizers[name] for name in (
            "intermediate_quantizer", "activation_quantizer", "feedforward_output_quantizer")]
        for quantizer in quantizers:
            quantizer.calibrating = True
        feedforward(block, y)
        for quantizer in quantizers:
            quantizer.calibrating = False
        errors[k] = np.abs(feedforward(block, y) - exact).max()
    assert errors[1] < 0.3 * errors[0], errors


def test_config_and_saving_keep_the_float_channels_and_the_order(tmp_path):
    model = outlier_classifier()
    qat = QatBert.from_float(model, float_residual=True, feedforward_float_channels=2)
    qat.calibrate([batch(10)])
    x = batch(3)
    assert QatBert.from_config(qat.get_config()).feedforward_float_channels == 2
    path = str(tmp_path / "qat.keras")
    qat.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(
        loaded.get_layer("transformer_layer_0").feedforward_channel_order.numpy(),
        qat.get_layer("transformer_layer_0").feedforward_channel_order.numpy())
    np.testing.assert_allclose(keras.ops.convert_to_numpy(loaded(x)),
                               keras.ops.convert_to_numpy(qat(x)), atol=1e-5)
    twin = qat.with_quantization(False)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(twin(x)),
                               keras.ops.convert_to_numpy(model(x)), atol=1e-4)


def test_float_channel_errors_name_the_argument():
    with pytest.raises(ValueError, match="needs `float_residual=True`.*"
                                         "feedforward_float_channels=2"):
        QatEncoderBlock(num_heads=2, intermediate_dim=F, feedforward_float_channels=2)
    for bad in (F, -1, 1.5, True):
        with pytest.raises(ValueError, match=r"integer in \[0, intermediate_dim\)"):
            QatEncoderBlock(num_heads=2, intermediate_dim=F, float_residual=True,
                            feedforward_float_channels=bad)
    backbone = BertBackbone(vocabulary_size=60, num_layers=1, num_heads=2, hidden_dim=8,
                            intermediate_dim=F, max_sequence_length=12)
    with pytest.raises(ValueError, match="needs `float_residual=True`"):
        QatBert.from_float(BertClassifier(backbone, num_classes=2),
                           feedforward_float_channels=2)
    block = float_block(2)
    with pytest.raises(ValueError, match=r"permutation of range\(16\).*shape \(15,\)"):
        block.permute_feedforward_channels(np.arange(15))
    with pytest.raises(ValueError, match=r"permutation of range\(16\)"):
        block.permute_feedforward_channels(np.zeros(F, "int32"))
    with pytest.raises(ValueError, match="feedforward_float_channels=0"):
        float_block(0).permute_feedforward_channels(np.arange(F))
    with pytest.raises(ValueError, match="No channel ranges"):
        ChannelRanges().widths()
