"""`QuantizedModel`: a `quantize_model` copy with the settings and calibration batches that
made it, so that an int8 accuracy budget can move any of its ops to float
(`quantization_budget`, `quantization_sensitivity`, `keras_attn.export.file_budget`).

    with_float_ops(ops):  quantize_model(float model, ops float) with every weight and range
                          of this copy at the same path (QAT's weights, the calibrated
                          ranges, the feed-forward channel order); only a quantizer the
                          new choice adds (a matmul now rounding its float input itself) is
                          calibrated, on the same batches

so a budget's step changes only the ops it names, whatever the model: a functional or
`Sequential` model of Keras layers, keras-attn's task models, nested models.
"""

import warnings

import numpy as np

from keras_attn.quantization.calibration import calibrate_model
from keras_attn.quantization.calibration import freeze_model_ranges
from keras_attn.quantization.dequantize_model import copy_float_weights
from keras_attn.quantization.dequantize_model import dequantize_model
from keras_attn.quantization.model_queries import uncalibrated_quantizers
from keras_attn.quantization.quantization_ops import check_float_ops
from keras_attn.quantization.quantize_model import copy_weight
from keras_attn.quantization.quantize_model import model_quantization_ops
from keras_attn.quantization.quantize_model import quantize_model
from keras_attn.quantization.quantize_model import quantized_copy

# The kernels of a block's weight matmuls (`EncoderInt8Layout`), by matmul name.
_MATMUL_KERNELS = {"qkv": "qkv_kernel", "attention_output": "output_kernel",
                   "intermediate": "intermediate_kernel",
                   "feedforward_output": "feedforward_output_kernel"}


class QuantizedModel:
    """A calibrated (or QAT-trained) `quantize_model` copy and the recipe that made it.

    Args:
        model: the `quantize_model` copy.
        calibration_batches: the model inputs its ranges were calibrated on (a budget's
            variants calibrate the quantizers they add on them).
        float_ops: the `model_quantization_ops` it computes in float.
        **settings: the other `quantize_model` settings it was made with
            (`weight_quantization`, `decay`, `float_residual`,
            `feedforward_float_channels`).

    Example:
    >>> import keras
    >>> inputs = keras.Input((4,))
    >>> hidden = keras.layers.Dense(8, activation="relu", name="hidden")(inputs)
    >>> model = keras.Model(inputs, keras.layers.Dense(2, name="logits")(hidden))
    >>> x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    >>> quantized = QuantizedModel.calibrated(model, [x], float_residual=True)
    >>> quantized.quantization_ops()
    ['hidden', 'logits']
    >>> quantized.with_float_ops(["logits"]).float_ops
    ('logits',)
    """

    def __init__(self, model, calibration_batches, float_ops=(), **settings):
        self.model = model
        self.batches = list(calibration_batches)
        self.float_ops = check_float_ops(float_ops, self.quantization_ops())
        self.settings = settings
        self._float_model = None

    @classmethod
    def calibrated(cls, model, calibration_batches, float_ops=(), **settings):
        """`quantize_model(model, float_ops=float_ops, **settings)`, calibrated on
        `calibration_batches` (`calibrate_model`)."""
        batches = list(calibration_batches)
        qat = quantize_model(model, float_ops=float_ops, **settings)
        calibrate_model(qat, batches)
        return cls(qat, batches, float_ops, **settings)

    def calibrate(self, batches):
        """Sets the ranges from `batches` (`calibrate_model`), which a budget's variants
        then calibrate the quantizers they add on."""
        self.batches = list(batches)
        calibrate_model(self.model, self.batches)

    def __call__(self, inputs, training=False):
        return self.model(inputs, training=training)

    def get_layer(self, name):
        """The layer `name` of the model, nested models (a task model's backbone) included."""
        return _layer_named(self.model, name)

    def quantization_ops(self):
        """The ops `float_ops` can name (`model_quantization_ops`), in graph order."""
        return model_quantization_ops(self.model)

    def float_model(self):
        """The float model with this copy's weights as they are now (`dequantize_model`,
        made once, its weights copied again at each call)."""
        if self._float_model is None:
            self._float_model = dequantize_model(self.model)
        else:
            copy_float_weights(self.model, self._float_model)
        return self._float_model

    def with_quantization(self, quantize):
        """This model (`quantize=True`), or its float model (what the budget's float
        metric is measured on)."""
        return self if quantize else self.float_model()

    def with_float_ops(self, float_ops):
        """A copy with the same weights and ranges computing `float_ops` in float, the
        other ops as this model does (see the module docstring)."""
        float_ops = check_float_ops(float_ops, self.quantization_ops())
        with warnings.catch_warnings():  # its unknown layers were named when it was made
            warnings.simplefilter("ignore", UserWarning)
            model = quantized_copy(self.float_model(), float_ops=float_ops, **self.settings)
        copy_matching_weights(self.model, model)
        if uncalibrated_quantizers(model):
            calibrate_model(model, self.batches, only_uncalibrated=True)
        return QuantizedModel(model, self.batches, float_ops, **self.settings)

    def freeze_ranges(self, frozen=True):
        """The ranges as constants of a traced graph (`freeze_model_ranges`)."""
        freeze_model_ranges(self.model, frozen)

    def op_weight_count(self, op):
        """How many weights op `op` stores in int8 (4 bytes each instead of 1 in float): a
        layer's matrices and tables (`Dense`, `Embedding`, `TokenAndPositionEmbedding`), or
        one block matmul's kernel without the feed-forward float channels."""
        name, _, matmul = op.partition("/")
        layer = _layer_named(self.model, name)
        if not matmul:
            return sum(_count(w) for w in layer.trainable_weights if len(w.shape) >= 2)
        kernel = layer._int8_weights()[_MATMUL_KERNELS[matmul]]
        float_channels = 0
        if matmul in ("intermediate", "feedforward_output"):
            float_channels = layer.feedforward_float_channels * int(
                np.prod(kernel.shape)) // layer.intermediate_dim
        return _count(kernel) - float_channels


def copy_matching_weights(source, target):
    """Copies every weight of `source` (a model) to the weight of `target` at the same path
    below the same-named layer, nested models included; weights only one of them has (a
    quantizer one of them adds) are left as they are."""
    for layer in target.layers:
        try:
            origin = source.get_layer(layer.name)
        except ValueError:
            continue
        if hasattr(layer, "layers") and hasattr(origin, "layers") and getattr(
                layer, "inputs", None):
            copy_matching_weights(origin, layer)
            continue
        values = {variable.path.split(f"{origin.name}/", 1)[-1]: variable
                  for variable in origin.weights}
        for variable in layer.weights:
            key = variable.path.split(f"{layer.name}/", 1)[-1]
            if key in values and tuple(values[key].shape) == tuple(variable.shape):
                variable.assign(copy_weight(values[key]))


def _layer_named(model, name):
    for layer in model._flatten_layers(include_self=False):
        if layer.name == name:
            return layer
    raise ValueError(f"the model has no layer {name!r}")


def _count(variable):
    return int(np.prod(variable.shape))

