"""Activation ranges of a `quantize_model` copy: `calibrate_model` sets them from forward
passes in inference mode (after moving each block's widest feed-forward channels last, the
ones it keeps in float), `freeze_model_ranges` makes them constants of the traced graph for
the converters."""

import numpy as np

from keras_attn.layers.feedforward_float_channels import ChannelRanges
from keras_attn.layers.quantized_dense import QuantizedDense
from keras_attn.layers.quantized_embedding import QuantizedEmbedding
from keras_attn.layers.quantized_reversible_embedding import QuantizedReversibleEmbedding
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.models.gpt_causal_lm import TiedEmbeddingLogits
from keras_attn.quantization.model_queries import BLOCKS
from keras_attn.quantization.model_queries import activation_quantizers
from keras_attn.quantization.model_queries import model_inputs
from keras_attn.quantization.model_queries import quantized_layer


def calibrate_model(model, batches, only_uncalibrated=False):
    """Sets the activation ranges of a `quantize_model` copy from forward passes in
    inference mode: each range becomes the running min/max over `batches` (an iterable of
    model inputs). Encoder blocks with `feedforward_float_channels` whose ranges are not
    set yet first get their widest feed-forward channels (the width `max - min` of the
    up-projection output over `batches`) stored last, the ones they keep in float.
    `only_uncalibrated=True` sets only the ranges not set yet (the others are left as
    they are)."""
    batches = list(batches)
    if not batches:
        raise ValueError("`calibrate_model` needs at least one batch. Received: batches=[]")
    _sort_feedforward_channels(model, batches)
    _calibrating_passes(model, batches, only_uncalibrated)


def _calibrating_passes(model, batches, only_uncalibrated=False):
    quantizers = [quantizer for quantizer in activation_quantizers(model)
                  if not only_uncalibrated or float(quantizer.initialized.numpy()) < 0.5]
    for quantizer in quantizers:
        quantizer.calibrating = True
    try:
        for batch in batches:
            model(model_inputs(model, batch), training=False)
    finally:
        for quantizer in quantizers:
            quantizer.calibrating = False


def _sort_feedforward_channels(model, batches):
    """Permutes the feed-forward channels of each block with float channels and no ranges
    yet, widest last, from one calibrating pass; the ranges are then as before the pass."""
    blocks = [layer for layer in model._flatten_layers(include_self=False)
              if quantized_layer(layer, BLOCKS) and layer.feedforward_float_channels
              and float(layer.quantizers["intermediate_quantizer"].initialized.numpy()) < 0.5]
    if not blocks:
        return
    quantizers = activation_quantizers(model)
    before = [[variable.numpy() for variable in (q.min_value, q.max_value, q.initialized)]
              for q in quantizers]
    for block in blocks:
        block.channel_statistics = ChannelRanges()
    try:
        _calibrating_passes(model, batches)
        widths = [block.channel_statistics.widths() for block in blocks]
    finally:
        for block in blocks:
            block.channel_statistics = None
    for block, width in zip(blocks, widths):
        block.permute_feedforward_channels(np.argsort(width, kind="stable"))
    for quantizer, values in zip(quantizers, before):
        for variable, value in zip((quantizer.min_value, quantizer.max_value,
                                    quantizer.initialized), values):
            variable.assign(value)


def freeze_model_ranges(model, frozen=True):
    """Every range of a `quantize_model` copy as constants of the traced graph (what the
    TFLite converter needs to turn fake quantization into int8 scales), or variables again."""
    quantizers = {quantizer.path: quantizer for quantizer in activation_quantizers(model)}
    for quantizer in quantizers.values():
        quantizer.frozen_range = (
            (float(quantizer.min_value.numpy()), float(quantizer.max_value.numpy()))
            if frozen else None)
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, (QuantizedDense, QuantizedEmbedding,
                              QuantizedReversibleEmbedding)) or quantized_layer(
                layer, BLOCKS + (TokenAndPositionEmbedding, TiedEmbeddingLogits)):
            layer.freeze_weight_ranges(frozen)
        producer = None
        if isinstance(layer, QuantizedDense) or quantized_layer(layer, BLOCKS):
            producer = layer.input_quantizer or quantizers.get(layer.input_producer)
        if hasattr(layer, "frozen_input_step"):
            # The bias is then rounded as the file stores it (`int32_bias`).
            layer.frozen_input_step = producer.step() if frozen and producer else None
