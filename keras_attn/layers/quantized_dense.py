"""`QuantizedDense`: a dense layer with symmetric fake-int8 weights (per output channel or
per tensor) run as the 1x1 convolution TFLite quantizes per channel."""

import keras
import numpy as np
from keras import ops

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_positive_int

WEIGHT_QUANTIZATIONS = ("per_channel", "per_tensor")


def check_weight_quantization(weight_quantization):
    """Raises unless `weight_quantization` is one of `WEIGHT_QUANTIZATIONS`."""
    if weight_quantization not in WEIGHT_QUANTIZATIONS:
        raise ValueError(
            f"`weight_quantization` must be one of {WEIGHT_QUANTIZATIONS}. "
            f"Received: weight_quantization={weight_quantization!r}"
        )


def weight_bound(kernel, axis=None):
    """`max|w|` of a weight (per tensor, or per slice along `axis`), at least 1e-8."""
    reduce_axes = None if axis is None else [i for i in range(len(kernel.shape)) if i != axis]
    return ops.maximum(ops.max(ops.abs(kernel), axis=reduce_axes), 1e-8)


def frozen_bound(kernel, axis=None):
    """`weight_bound` as a NumPy constant (for export: the TFLite converter turns a
    FakeQuant into int8 scales only when its min/max fold to constants, and bounds read
    from variables did not)."""
    return np.asarray(ops.convert_to_numpy(weight_bound(kernel, axis)), "float32")


def fake_quantize_weight(kernel, axis=None, bound=None):
    """Symmetric int8 fake quantization of a weight: range `[-a, a]` with `a = max|w|`
    (per tensor, or per slice along `axis`; `bound` gives `a` precomputed), 255 levels
    (`narrow_range`), so the int8 zero point is 0 as TFLite requires for weights."""
    if bound is None:
        bound = weight_bound(kernel, axis)
    return keras.quantizers.fake_quant_with_min_max_vars(
        kernel, -bound, bound, num_bits=8, narrow_range=True, axis=axis
    )


def matmul_bound(kernel, weight_quantization):
    """The frozen weight bound `quantized_matmul` uses for `kernel` `(in, out)`."""
    return frozen_bound(kernel, axis=1 if weight_quantization == "per_channel" else None)


def int32_bias(bias, input_step, bound):
    """The bias as the int8 file stores it: int32 at the scale of the accumulator,
    `s_b = s_x s_w` (input step times the weight step `bound / 127`, per output channel
    for per-channel weights):

        b_q = round(b / s_b) s_b

    A rounding the float bias does not have; it is below one output step, but it decides
    which side of a rounding boundary an output lands on, and those flips grow through
    the blocks."""
    scale = input_step * bound / 127.0  # (out,) or ()
    return bias + ops.stop_gradient(ops.round(bias / scale) * scale - bias)


def quantized_matmul(x, kernel, bias, quantize, weight_quantization, bound=None,
                     input_step=None):
    """`x @ kernel + bias` for 2-D `x` `(N, in)` and kernel `(in, out)`, with the kernel
    fake-quantized (`bias=None`: no bias) and, given the step of the int8 input
    `input_step` (frozen ranges: export and scoring), the bias rounded as the int8 file
    stores it (`int32_bias`).

    Per-tensor weights run as a MatMul (TFLite FULLY_CONNECTED). Per-channel weights run
    as a 1x1 convolution over a `(1, 1, N, in)` image: the TFLite converter rejects a
    per-output-channel fake quant on a MatMul kernel ("mismatched quantized axes": TF
    kernels are `[in, out]`, FULLY_CONNECTED's `[out, in]`), while Conv2D kernels
    `[1, 1, in, out]` carry the output channel last, the axis both TF and TFLite quantize.
    """
    in_dim, out_dim = kernel.shape
    if quantize and input_step is not None and bias is not None:
        if bound is None:
            bound = weight_bound(kernel, 1 if weight_quantization == "per_channel" else None)
        bias = int32_bias(bias, input_step, bound)
    if quantize and weight_quantization == "per_channel":
        kernel = fake_quantize_weight(ops.reshape(kernel, (1, 1, in_dim, out_dim)), axis=3,
                                      bound=bound)
        image = ops.reshape(x, (1, 1, -1, in_dim))  # (1, 1, N, in)
        y = ops.conv(image, kernel, strides=1, padding="valid")  # (1, 1, N, out)
        y = ops.reshape(y, (-1, out_dim))  # (N, out)
    else:
        if quantize:
            kernel = fake_quantize_weight(kernel, bound=bound)
        y = ops.matmul(x, kernel)  # (N, out)
    return y if bias is None else ops.add(y, bias)


@keras.saving.register_keras_serializable(package="keras_attn")
class QuantizedDense(keras.layers.Layer):
    """Dense layer for quantization-aware training: int8 fake-quantized weights and output.

        y = act(Q_a(W_q x + b)),  W_q = FakeQuant(W) (symmetric), Q_a = ActivationQuantizer

    The input is expected to be quantized already (each tensor is quantized once, where it
    is produced), or is rounded by the layer itself with `quantize_input=True`. With an
    activation, its output is quantized again by `activation_quantizer`; the
    pre-activation by `output_quantizer`.

    Args:
        units: int, output size.
        activation: optional Keras activation (e.g. `"tanh"`, BERT's pooler).
        weight_quantization: `"per_channel"` (one scale per output unit) or
            `"per_tensor"`. Defaults to `"per_channel"`.
        quantize: bool; `False` runs the same graph in float. Defaults to `True`.
        decay: float, EMA factor of the activation ranges. Defaults to `0.999`.
        quantize_output: bool, round the output (after the activation) to int8, for a
            next int8 matmul. Defaults to `quantize`.
        quantize_input: bool, round a float input to int8 (`input_quantizer`), for an
            input that no int8 layer produced. Defaults to `False`.
        input_producer: optional path of the `ActivationQuantizer` whose int8 codes the
            input carries (`quantize_model` sets it): frozen ranges round the bias at its
            step (`int32_bias`), as the int8 file stores it. Defaults to `None`.
        **kwargs: base `keras.layers.Layer` arguments.

    Call arguments:
        inputs: `(..., in)` float tensor.
        training: bool, updates the activation ranges.

    Returns:
        `(..., units)` tensor.

    Example:
    >>> layer = QuantizedDense(3)
    >>> tuple(layer(np.ones((2, 4, 5), "float32"), training=True).shape)
    (2, 4, 3)
    """

    def __init__(self, units, activation=None, weight_quantization="per_channel",
                 quantize=True, decay=0.999, quantize_output=None, quantize_input=False,
                 input_producer=None, **kwargs):
        check_positive_int("units", units)
        check_weight_quantization(weight_quantization)
        quantize_output = quantize if quantize_output is None else quantize_output
        check_bool("quantize_output", quantize_output)
        check_bool("quantize_input", quantize_input)
        super().__init__(**kwargs)
        self.units = units
        self.activation = keras.activations.get(activation)
        self.weight_quantization = weight_quantization
        self.quantize = quantize
        self.decay = decay
        self.quantize_output = quantize_output
        self.quantize_input = quantize_input
        self.input_producer = input_producer
        self.input_quantizer = (ActivationQuantizer(decay=decay, quantize=quantize,
                                                    name="input_quantizer")
                                if quantize_input else None)
        self.output_quantizer = ActivationQuantizer(
            decay=decay, quantize=quantize if activation is not None else quantize_output,
            name="output_quantizer"
        )
        self.frozen_bounds = None
        # Set when the ranges are frozen: the step of the int8 input (rounds the bias).
        self.frozen_input_step = None
        self.activation_quantizer = None
        if activation is not None:
            self.activation_quantizer = ActivationQuantizer(
                decay=decay, quantize=quantize_output, name="activation_quantizer"
            )

    def build(self, inputs_shape):
        in_dim = inputs_shape[-1]
        self.kernel = self.add_weight(name="kernel", shape=(in_dim, self.units))
        self.bias = self.add_weight(name="bias", shape=(self.units,), initializer="zeros")
        out_shape = tuple(inputs_shape[:-1]) + (self.units,)
        if self.input_quantizer is not None:
            self.input_quantizer.build(inputs_shape)
        self.output_quantizer.build(out_shape)
        if self.activation_quantizer is not None:
            self.activation_quantizer.build(out_shape)
        self.built = True

    def call(self, inputs, training=None):
        if self.input_quantizer is not None:
            inputs = self.input_quantizer(inputs, training=training)
        in_dim = self.kernel.shape[0]
        leading = ops.shape(inputs)[:-1]
        x = ops.reshape(inputs, (-1, in_dim))  # (N, in)
        bound = self.frozen_bounds["kernel"] if self.frozen_bounds else None
        y = quantized_matmul(x, self.kernel, self.bias, self.quantize,
                             self.weight_quantization, bound,
                             self.frozen_input_step)  # (N, units)
        y = self.output_quantizer(y, training=training)
        if self.activation_quantizer is not None:
            y = self.activation_quantizer(self.activation(y), training=training)
        return ops.reshape(y, tuple(leading) + (self.units,))  # (..., units)

    def freeze_weight_ranges(self, frozen=True):
        """Weight ranges as constants of the traced graph (export) or computed again."""
        self.frozen_bounds = (
            {"kernel": matmul_bound(self.kernel, self.weight_quantization)} if frozen else None
        )

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config.update(
            units=self.units,
            activation=keras.activations.serialize(self.activation)
            if self.activation_quantizer is not None else None,
            weight_quantization=self.weight_quantization,
            quantize=self.quantize,
            decay=self.decay,
            quantize_output=self.quantize_output,
            quantize_input=self.quantize_input,
            input_producer=self.input_producer,
        )
        return config
