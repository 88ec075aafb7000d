"""`quantize_model`: the quantization-aware form of a functional or `Sequential` Keras model
of Keras layers and keras-attn's post-LN encoder blocks and embeddings (pre-LN, decoder and
relative-attention blocks and nested models are not yet known to it: they stay float, named in
its warning).

The model is cloned (`keras.models.clone_model`) with every `Dense` replaced by a
`QuantizedDense` (int8 weights, per output channel by default, and an int8 output; its bias
rounded at the int32 scale the file stores) and every last-axis `LayerNormalization` by a
`QuantizedLayerNormalization` (its MEAN, SUB, MUL, RSQRT rounded as the int8 file rounds
them) and every `Embedding` by a `QuantizedEmbedding` (its table rounded to the one int8
scale the file's GATHER reads), every post-LN `TransformerEncoderBlock` and every
`TokenAndPositionEmbedding` by the same layer with its int8 layout (`quantization`), holding
the same weights, an `ActivationQuantizer` on each
float model input (the file's QUANTIZE) and after every other layer whose output the int8
TFLite file stores in int8 (Jacob et al., 2018). `keras_attn.export.model_int8_tflite`
writes the full-int8 file. Layers that keep their input's int8 scale (dropout, reshaping,
slicing, max pooling) get none. A layer `quantize_model` does not know stays float, gets no
quantizer and is named in a warning: the TFLite converter then calibrates its output (post-
training), nothing is rounded in silence.

Example:
>>> inputs = keras.Input((4,))
>>> hidden = keras.layers.Dense(8, activation="relu")(inputs)
>>> model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
>>> qat = quantize_model(model)
>>> calibrate_model(qat, [np.random.default_rng(0).normal(size=(16, 4)).astype("float32")])
>>> [type(layer).__name__ for layer in qat.layers]
['InputLayer', 'ActivationQuantizer', 'QuantizedDense', 'QuantizedDense']
"""

import warnings

import keras

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.quantized_dense import QuantizedDense
from keras_attn.layers.quantized_dense import check_weight_quantization
from keras_attn.layers.quantized_embedding import QuantizedEmbedding
from keras_attn.layers.quantized_layer_normalization import QuantizedLayerNormalization
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.layers.transformer_encoder_block import TransformerEncoderBlock

# Keras layers whose int8 output has their input's scale (TFLite keeps it): no quantizer.
SCALE_KEEPING = (keras.layers.InputLayer, keras.layers.Dropout, keras.layers.Reshape,
                 keras.layers.Flatten, keras.layers.Permute, keras.layers.Cropping1D,
                 keras.layers.MaxPooling1D, keras.layers.GlobalMaxPooling1D,
                 keras.layers.SpatialDropout1D)
# Keras layers computed in int8 after their output is rounded by a quantizer.
ROUNDED = (keras.layers.LayerNormalization, keras.layers.Activation, keras.layers.ReLU,
           keras.layers.Add, keras.layers.Subtract, keras.layers.Multiply,
           keras.layers.Concatenate, keras.layers.Average, keras.layers.AveragePooling1D,
           keras.layers.GlobalAveragePooling1D, keras.layers.Softmax, keras.layers.Embedding,
           keras.layers.Lambda)


def quantize_model(model, weight_quantization="per_channel", decay=0.999,
                   float_residual=False):
    """The quantization-aware copy of `model` (which is left as it is).

    Args:
        model: a functional or `Sequential` `keras.Model` of Keras layers (`Dense`,
            `Embedding`, `LayerNormalization`, activations, `Add` and the other merges,
            `Dropout`, pooling, reshaping).
        weight_quantization: `"per_channel"` or `"per_tensor"` int8 weights of `Dense`
            and of the encoder blocks' matmuls.
        decay: float, EMA factor of the activation ranges.
        float_residual: bool, the encoder blocks' residual sums, LayerNorms and attention
            products in float (`EncoderInt8Layout`); their weight matmuls and outputs
            stay int8. Defaults to `False` (all int8).

    Returns:
        A `keras.Model` with the same inputs, outputs and weights, fake-quantized; set its
        ranges with `calibrate_model` or by training it (`fit`).
    """
    check_weight_quantization(weight_quantization)
    if not isinstance(model, keras.Model) or not hasattr(model, "inputs") or not model.inputs:
        raise ValueError("`quantize_model` takes a built functional or Sequential Keras model. "
                         f"Received: model={type(model).__name__}")
    tracker = _Int8Tensors(decay)

    def clone(layer):
        if isinstance(layer, keras.layers.Dense) and not isinstance(layer, QuantizedDense):
            return QuantizedDense(layer.units, activation=_activation(layer),
                                  weight_quantization=weight_quantization, decay=decay,
                                  name=layer.name)
        if isinstance(layer, keras.layers.LayerNormalization) and layer.axis in (-1, [-1]) \
                and not isinstance(layer, QuantizedLayerNormalization):
            return QuantizedLayerNormalization(decay=decay, **layer.get_config())
        if isinstance(layer, keras.layers.Embedding) and not isinstance(
                layer, QuantizedEmbedding):
            return QuantizedEmbedding(**layer.get_config())
        if _quantizable_block(layer):
            return TransformerEncoderBlock.from_config({**layer.get_config(), "quantization": {
                "weight_quantization": weight_quantization, "decay": decay,
                "float_residual": float_residual}})
        if isinstance(layer, TokenAndPositionEmbedding) and layer.quantization is None:
            return TokenAndPositionEmbedding.from_config(
                {**layer.get_config(), "quantization": {"decay": decay}})
        return layer.__class__.from_config(layer.get_config())

    def call(layer, *args, **kwargs):
        args = keras.tree.map_structure(tracker.quantized_input, args)
        first = keras.tree.flatten(args)[0] if keras.tree.flatten(args) else None
        if isinstance(layer, QuantizedDense):
            layer.input_quantizer = tracker.producer_path(first)
        if _quantized(layer, TransformerEncoderBlock):
            layer = _reading(layer, tracker.producer_path(first))
        outputs = layer(*args, **kwargs)
        if isinstance(layer, QuantizedDense):
            tracker.produced(outputs, layer.activation_quantizer or layer.output_quantizer)
        elif _quantized(layer, TransformerEncoderBlock):
            tracker.produced(outputs, layer.quantizers["feedforward_layer_norm_quantizer"])
        elif _quantized(layer, TokenAndPositionEmbedding):
            tracker.produced(outputs, layer.quantizers["output_quantizer"])
        elif isinstance(layer, ROUNDED):
            quantizer = ActivationQuantizer(decay=decay, name=f"{layer.name}_output_quantizer")
            outputs = keras.tree.map_structure(quantizer, outputs)
            tracker.produced(outputs, quantizer)
        elif isinstance(layer, SCALE_KEEPING):
            tracker.produced(outputs, tracker.producer(first))
        else:
            tracker.produced(outputs, None)
        return outputs

    if isinstance(model, keras.Sequential):  # `call_function` needs the functional form
        model = keras.Model(model.inputs, model.outputs, name=model.name)
    qat = keras.models.clone_model(model, clone_function=clone, call_function=call)
    _copy_weights(model, qat)
    unknown = float_layers(qat)
    if unknown:
        warnings.warn(f"quantize_model keeps {len(unknown)} layer(s) in float, unquantized "
                      f"(not a layer it knows): {', '.join(unknown)}", stacklevel=2)
    return qat


def float_layers(model):
    """The names of the layers of a `quantize_model` copy (or of a model about to be
    quantized) that `quantize_model` does not know and so leaves in float, unquantized."""
    known = SCALE_KEEPING + ROUNDED + (keras.layers.Dense, QuantizedDense, ActivationQuantizer,
                                       TokenAndPositionEmbedding)
    return [layer.name for layer in model.layers
            if not (isinstance(layer, known) or _quantizable_block(layer)
                    or _quantized(layer, TransformerEncoderBlock))]


def _quantizable_block(layer):
    """A float encoder block that has an int8 layout (post-LN)."""
    return (isinstance(layer, TransformerEncoderBlock) and layer.quantization is None
            and not layer.norm_first)


def _quantized(layer, kind):
    return isinstance(layer, kind) and layer.quantization is not None


def _reading(block, producer):
    """`block` (a quantized encoder block, not yet called) set to read an input whose int8
    codes `producer` made, or to round a float input itself (`quantize_input`)."""
    settings = ({"input_producer": producer} if producer is not None
                else {"quantize_input": True})
    config = block.get_config()
    return TransformerEncoderBlock.from_config(
        {**config, "quantization": {**config["quantization"], **settings}})


class _Int8Tensors:
    """While `quantize_model` rebuilds the graph: which quantizer's int8 codes each tensor
    carries, and a quantizer on each float model input (the file's QUANTIZE)."""

    def __init__(self, decay):
        self.decay = decay
        self.producers = {}  # id(tensor) -> ActivationQuantizer or None (float)
        self.inputs = {}  # id(model input) -> its quantized tensor

    def produced(self, outputs, quantizer):
        for tensor in keras.tree.flatten(outputs):
            self.producers[id(tensor)] = quantizer

    def producer(self, tensor):
        return self.producers.get(id(tensor))

    def producer_path(self, tensor):
        quantizer = self.producer(tensor)
        return None if quantizer is None else quantizer.path

    def quantized_input(self, tensor):
        """A model input (a tensor no layer produced), float: through its quantizer."""
        if not isinstance(tensor, keras.KerasTensor) or id(tensor) in self.producers:
            return tensor
        if id(tensor) not in self.inputs:
            if not keras.backend.is_float_dtype(tensor.dtype):
                return tensor
            name = (tensor.name or "input").split("/")[0]
            quantizer = ActivationQuantizer(decay=self.decay, name=f"{name}_input_quantizer")
            quantized = quantizer(tensor)
            self.produced(quantized, quantizer)
            self.inputs[id(tensor)] = quantized
        return self.inputs[id(tensor)]


def _activation(dense):
    name = keras.activations.serialize(dense.activation)
    return None if name == "linear" else dense.activation


def _copy_weights(model, qat):
    for layer in model.layers:
        if not layer.weights:
            continue
        target = qat.get_layer(layer.name)
        if isinstance(target, (TransformerEncoderBlock, TokenAndPositionEmbedding)):
            _copy_by_path(layer, target)
        elif isinstance(target, QuantizedDense):
            target.kernel.assign(layer.kernel)
            if layer.bias is not None:
                target.bias.assign(layer.bias)
        elif isinstance(target, QuantizedLayerNormalization):
            for name in ("gamma", "beta"):
                if getattr(layer, name) is not None:
                    getattr(target, name).assign(getattr(layer, name))
        else:
            target.set_weights(layer.get_weights())


def _copy_by_path(layer, target):
    """Copies each weight of `layer` to the weight of `target` at the same path below the
    layer (`target` has the same sublayers, and quantizers besides)."""
    targets = {variable.path.split("/", 1)[1]: variable for variable in target.weights}
    for variable in layer.weights:
        targets[variable.path.split("/", 1)[1]].assign(variable)


def activation_quantizers(model):
    """Every `ActivationQuantizer` of `model`, sublayers included, in graph order."""
    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, ActivationQuantizer)]


def calibrate_model(model, batches):
    """Sets the activation ranges of a `quantize_model` copy from forward passes in
    inference mode: each range becomes the running min/max over `batches` (an iterable of
    model inputs)."""
    quantizers = activation_quantizers(model)
    for quantizer in quantizers:
        quantizer.calibrating = True
    try:
        count = 0
        for batch in batches:
            model(batch, training=False)
            count += 1
        if not count:
            raise ValueError("`calibrate_model` needs at least one batch. Received: batches=[]")
    finally:
        for quantizer in quantizers:
            quantizer.calibrating = False


def freeze_model_ranges(model, frozen=True):
    """Every range of a `quantize_model` copy as constants of the traced graph (what the
    TFLite converter needs to turn fake quantization into int8 scales), or variables again."""
    quantizers = {quantizer.path: quantizer for quantizer in activation_quantizers(model)}
    for quantizer in quantizers.values():
        quantizer.frozen_range = (
            (float(quantizer.min_value.numpy()), float(quantizer.max_value.numpy()))
            if frozen else None)
    for layer in model._flatten_layers(include_self=False):
        if isinstance(layer, (QuantizedDense, QuantizedEmbedding)) or _quantized(
                layer, (TransformerEncoderBlock, TokenAndPositionEmbedding)):
            layer.freeze_weight_ranges(frozen)
        producer = None
        if isinstance(layer, QuantizedDense):
            producer = quantizers.get(layer.input_quantizer)
        elif _quantized(layer, TransformerEncoderBlock):
            producer = quantizers.get(layer.input_producer)
        if hasattr(layer, "frozen_input_step"):
            # The bias is then rounded as the file stores it (`int32_bias`).
            layer.frozen_input_step = producer.step() if frozen and producer else None
