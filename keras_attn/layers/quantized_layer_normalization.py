"""`QuantizedLayerNormalization`: LayerNorm written with the ops TFLite quantizes, each
intermediate tensor fake-quantized where the int8 file rounds it (`layer_norm`)."""

import keras
from keras import ops

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.validation import check_bool

# `centered * inverse_std * gamma + beta` gets no quantizer before the output's: the
# converter folds `* gamma + beta` away when gamma = 1 and beta = 0 (fresh weights),
# and two quantizers then land on one tensor ("same scale constraint" error).
LAYER_NORM_PARTS = ("mean", "centered", "variance", "inverse_std")


def layer_norm_quantizers(prefix, decay, quantize):
    """The `ActivationQuantizer`s of the intermediate tensors of `layer_norm`."""
    return {
        part: ActivationQuantizer(decay=decay, quantize=quantize,
                                  name=f"{prefix}_{part}_quantizer")
        for part in LAYER_NORM_PARTS
    }


def layer_norm(x, gamma, beta, epsilon, quantizers=None, training=None):
    """LayerNorm over the last axis (Ba et al., 2016), written with the ops TFLite
    quantizes (MEAN, SUB, MUL, RSQRT, ADD):

        y = (x - mean(x)) / sqrt(var(x) + eps) * gamma + beta

    With `quantizers` (from `layer_norm_quantizers`) every intermediate tensor is
    fake-quantized, so the int8 TFLite LayerNorm (which has no fused kernel) computes
    what the QAT model trained with, instead of ranges calibrated by the converter.
    """
    def q(part, tensor):
        return tensor if quantizers is None else quantizers[part](tensor, training=training)

    mean = q("mean", ops.mean(x, axis=-1, keepdims=True))  # (N, 1)
    centered = q("centered", ops.subtract(x, mean))  # (N, H)
    # centered * centered, not square: TFLite has no int8 SQUARE (it would run in float
    # between a DEQUANTIZE and a QUANTIZE); an int8 MUL does the same.
    variance = ops.mean(centered * centered, axis=-1, keepdims=True)  # (N, 1)
    variance = q("variance", variance + epsilon)
    if quantizers is not None and quantizers["variance"].quantize:
        # A row whose variance is under half a step of the variance range rounds to
        # code 0, and rsqrt(0) = inf would poison the ranges and then every weight
        # (measured: NaN at step 15 of QAT on SST-2 MiniLM). Floored at one step, such
        # rows get rsqrt(step), clipped to the `inverse_std` range; the MAXIMUM with a
        # constant of the same scale converts to an exact int8 op, so the int8 TFLite
        # model computes what QAT trained with.
        variance = ops.maximum(variance, ops.maximum(quantizers["variance"].step(), epsilon))
    inverse_std = q("inverse_std", ops.rsqrt(variance))  # (N, 1)
    return centered * inverse_std * gamma + beta  # (N, H)



@keras.saving.register_keras_serializable(package="keras_attn")
class QuantizedLayerNormalization(keras.layers.LayerNormalization):
    """`keras.layers.LayerNormalization` over the last axis with every intermediate tensor
    fake-quantized where the int8 TFLite LayerNorm (MEAN, SUB, MUL, RSQRT, ADD; no fused
    kernel) rounds it (`layer_norm`), so the file computes what QAT trained.

    Args:
        decay: float, EMA factor of the activation ranges.
        quantize: bool, `False` computes the same ops in float, unrounded (the layout of a
            float file). Defaults to `True`.
        **kwargs: `keras.layers.LayerNormalization` arguments (`axis=-1`).
    """

    def __init__(self, decay=0.999, quantize=True, **kwargs):
        super().__init__(**kwargs)
        check_bool("quantize", quantize)
        if self.axis not in (-1, [-1]):
            raise ValueError("QuantizedLayerNormalization normalizes the last axis only. "
                             f"Received: axis={self.axis!r}")
        self.decay = decay
        self.quantize = quantize
        self.part_quantizers = layer_norm_quantizers("layer_norm", decay, True) if quantize \
            else {}

    def build(self, input_shape):
        super().build(input_shape)
        reduced = tuple(input_shape[:-1]) + (1,)
        for part, quantizer in self.part_quantizers.items():
            quantizer.build(input_shape if part == "centered" else reduced)

    def call(self, inputs, training=None):
        gamma = 1.0 if self.gamma is None else self.gamma
        beta = 0.0 if self.beta is None else self.beta
        return layer_norm(inputs, gamma, beta, self.epsilon, self.part_quantizers or None,
                          training)

    def get_config(self):
        return {**super().get_config(), "decay": self.decay, "quantize": self.quantize}
