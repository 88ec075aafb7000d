"""`quantize_model`: the quantization-aware form of a functional or `Sequential` Keras model
of Keras layers and keras-attn's encoder blocks, decoder blocks (decoder-only or with
cross-attention, with or without their caches), XLNet's blocks (content stream),
Transformer-XL's blocks (causal, with a memory) and embeddings, nested models included.

The model is cloned (`keras.models.clone_model`) with every `Dense` replaced by a
`QuantizedDense` (int8 weights, per output channel by default, and an int8 output; its bias
rounded at the int32 scale the file stores) and every last-axis `LayerNormalization` by a
`QuantizedLayerNormalization` (its MEAN, SUB, MUL, RSQRT rounded as the int8 file rounds
them) and every `Embedding` by a `QuantizedEmbedding` (its table rounded to the one int8
scale the file's GATHER reads; a `ReversibleEmbedding` by a `QuantizedReversibleEmbedding`,
whose logits read the same int8 table), every `TransformerEncoderBlock`,
`TransformerDecoderBlock`, `XLNetBlock`, `TransformerXLBlock` and `TokenAndPositionEmbedding`
by the same layer
with its int8 layout (`quantization`), holding the same weights, an `ActivationQuantizer` on
each float model input (the file's QUANTIZE) and after every other layer whose output the int8
TFLite file stores in int8 (Jacob et al., 2018), the float `x * c`, `x + y` of a functional
graph included (all-int8 only: a float residual stream keeps them float).
`keras_attn.export.tflite.model_int8_tflite` writes the full-int8 file. Layers that keep their
input's int8 scale (dropout, reshaping, slicing, max pooling, `TransformerXLLM`'s padding
mask update) get none. A layer
`quantize_model` does not know stays float, gets no quantizer and is named in a warning: the
TFLite converter then calibrates its output (post-training), nothing is rounded in silence.

Example:
>>> inputs = keras.Input((4,))
>>> hidden = keras.layers.Dense(8, activation="relu")(inputs)
>>> model = keras.Model(inputs, keras.layers.Dense(2)(hidden))
>>> qat = quantize_model(model)
>>> from keras_attn.quantization.calibration import calibrate_model
>>> calibrate_model(qat, [np.random.default_rng(0).normal(size=(16, 4)).astype("float32")])
>>> [type(layer).__name__ for layer in qat.layers]
['InputLayer', 'ActivationQuantizer', 'QuantizedDense', 'QuantizedDense']
"""

import warnings

import keras
import numpy as np

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.crf import CRF
from keras_attn.layers.int8_layout_settings import check_feedforward_float_channels
from keras_attn.layers.position_embedding import PositionEmbedding
from keras_attn.layers.quantized_dense import QuantizedDense
from keras_attn.layers.quantized_dense import check_weight_quantization
from keras_attn.layers.quantized_embedding import QuantizedEmbedding
from keras_attn.layers.quantized_layer_normalization import QuantizedLayerNormalization
from keras_attn.layers.quantized_reversible_embedding import QuantizedReversibleEmbedding
from keras_attn.layers.sinusoidal_position_encoding import SinusoidalPositionEncoding
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.layers.validation import check_bool
from keras_attn.models.gpt_causal_lm import TiedEmbeddingLogits
from keras_attn.models.transformer_xl_lm import AppendToMemory
from keras_attn.models.transformer_xl_lm import MemoryUpdate
from keras_attn.quantization.crf_tagger_copy import with_crf_loss
from keras_attn.quantization.model_queries import BLOCKS
from keras_attn.quantization.model_queries import quantized_layer
from keras_attn.quantization.quantization_ops import check_float_ops

# Keras layers whose int8 output has their input's scale (TFLite keeps it): no quantizer.
SCALE_KEEPING = (keras.layers.InputLayer, keras.layers.Dropout, keras.layers.Reshape,
                 keras.layers.Flatten, keras.layers.Permute, keras.layers.Cropping1D,
                 keras.layers.MaxPooling1D, keras.layers.GlobalMaxPooling1D,
                 keras.layers.SpatialDropout1D, AppendToMemory)
# Layers decoded outside the int8 file, in float (a CRF's Viterbi over the emissions): known,
# no quantizer; the file holds the network up to them (`emissions_model`).
DECODED_OUTSIDE = (CRF,)
# Keras operations (`x[:, 0]`, `ops.reshape` in a functional model) that keep the scale.
SCALE_KEEPING_OPS = ("GetItem", "Reshape", "Squeeze", "ExpandDims", "Transpose")
# Keras operations of a functional model (`x * c`, `x + y`) computed in int8 (ADD, MUL)
# in an all-int8 file: their float outputs are rounded by a quantizer.
ROUNDED_OPS = ("Add", "Multiply", "Subtract")
# Keras layers computed in int8 after their output is rounded by a quantizer.
ROUNDED = (keras.layers.LayerNormalization, keras.layers.Activation, keras.layers.ReLU,
           keras.layers.Add, keras.layers.Subtract, keras.layers.Multiply,
           keras.layers.Concatenate, keras.layers.Average, keras.layers.AveragePooling1D,
           keras.layers.GlobalAveragePooling1D, keras.layers.Softmax, keras.layers.Embedding,
           keras.layers.Lambda, SinusoidalPositionEncoding, PositionEmbedding, MemoryUpdate)


def quantize_model(model, weight_quantization="per_channel", decay=0.999,
                   float_residual=False, feedforward_float_channels=0, float_ops=()):
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
        feedforward_float_channels: int, with `float_residual`: the widest feed-forward
            hidden channels of each encoder block kept in float (LLM.int8()'s
            decomposition; `calibrate_model` finds them). Defaults to `0`.
            `**QuantizationRecipe().layout()` gives the default recipe's two settings.
        float_ops: names of `model_quantization_ops(model)` computed in float (an int8
            budget's choices), with `float_residual`: a `Dense` or embedding by its name
            (no rounding of its weights or output), a block's matmul as
            `"<block>/<matmul>"`.

    Returns:
        A `keras.Model` with the same inputs, outputs and weights, fake-quantized; set its
        ranges with `calibrate_model` or by training it (`fit`).
    """
    check_weight_quantization(weight_quantization)
    check_bool("float_residual", float_residual)
    check_feedforward_float_channels(feedforward_float_channels, None, float_residual)
    if not isinstance(model, keras.Model) or not hasattr(model, "inputs") or not model.inputs:
        raise ValueError("`quantize_model` takes a built functional or Sequential Keras model. "
                         f"Received: model={type(model).__name__}")
    float_ops = check_float_ops(float_ops, model_quantization_ops(model))
    if float_ops and not float_residual:
        raise ValueError(
            "`float_ops` needs `float_residual=True`: an all-int8 file is calibrated by the "
            "converter wherever QAT left a tensor float, so the ops would be int8 anyway. "
            f"Received: float_ops={list(float_ops)!r}, float_residual=False")
    return quantized_copy(model, weight_quantization, decay, float_residual,
                          feedforward_float_channels, float_ops)


def quantized_copy(model, weight_quantization="per_channel", decay=0.999,
                   float_residual=False, feedforward_float_channels=0, float_ops=()):
    """`quantize_model` without its one file check: `float_ops` are float in the Keras
    model also without `float_residual` (what `quantization_sensitivity` measures of an
    all-int8 model, whose file would still round them: the converter calibrates them)."""
    if isinstance(model, keras.Sequential):  # `call_function` needs the functional form
        model = keras.Model(model.inputs, model.outputs, name=model.name)
    float_ops = check_float_ops(float_ops, model_quantization_ops(model))
    graph = _Int8Graph(weight_quantization, decay, float_residual, feedforward_float_channels,
                       float_ops)
    qat = keras.models.clone_model(model, clone_function=graph.clone, call_function=graph.call,
                                   recursive=True)
    copy_model_weights(model, qat)
    unknown = float_layers(qat)
    if unknown:
        warnings.warn(f"quantize_model keeps {len(unknown)} layer(s) in float, unquantized "
                      f"(not a layer it knows): {', '.join(unknown)}", stacklevel=3)
    return with_crf_loss(qat)


def model_quantization_ops(model):
    """The ops of `model` (float, or a `quantize_model` copy) that `quantize_model`'s
    `float_ops` can keep in float, in graph order: each `Dense`, `Embedding`,
    `TokenAndPositionEmbedding` and tied LM head by its name, each block's weight matmuls as
    `"<block>/<matmul>"` (`MATMULS`: qkv, attention_output, intermediate,
    feedforward_output); nested models' ops included."""
    names = []
    for layer in model.layers:
        if _nested(layer):
            names += model_quantization_ops(layer)
        elif quantizable_block(layer) or quantized_layer(layer, BLOCKS):
            names += [f"{layer.name}/{matmul}" for matmul in layer.int8_matmuls()]
        elif isinstance(layer, (keras.layers.Dense, keras.layers.Embedding, QuantizedDense,
                                TokenAndPositionEmbedding, TiedEmbeddingLogits)):
            names.append(layer.name)
    return names


def float_layers(model):
    """The names of the layers of a `quantize_model` copy (or of a model about to be
    quantized) that `quantize_model` does not know and so leaves in float, unquantized."""
    known = SCALE_KEEPING + ROUNDED + DECODED_OUTSIDE + (
        keras.layers.Dense, QuantizedDense, ActivationQuantizer, TokenAndPositionEmbedding,
        TiedEmbeddingLogits)
    names = []
    for layer in model.layers:
        if _nested(layer):
            names += [f"{layer.name}/{name}" for name in float_layers(layer)]
        elif not (isinstance(layer, known) or quantizable_block(layer)
                  or quantized_layer(layer, BLOCKS)):
            names.append(layer.name)
    return names


def _nested(layer):
    """A functional model used as a layer (a task model's backbone)."""
    return isinstance(layer, keras.Model) and hasattr(layer, "inputs") and bool(layer.inputs)


def quantizable_block(layer):
    """A float block that has an int8 layout (an encoder block, a decoder block)."""
    return isinstance(layer, BLOCKS) and layer.quantization is None


class _Int8Graph:
    """`quantize_model`'s `clone_model` functions: which layer each layer becomes (`clone`),
    and while the graph is rebuilt (`call`), which quantizer's int8 codes each tensor
    carries (`None`: float), a quantizer on each float model input (the file's QUANTIZE),
    and a weight matmul reading a float tensor rounds it itself (`quantize_input`)."""

    def __init__(self, weight_quantization, decay, float_residual, feedforward_float_channels,
                 float_ops):
        self.float_ops = float_ops
        self.weight_quantization = weight_quantization
        self.decay = decay
        self.float_residual = float_residual
        self.feedforward_float_channels = feedforward_float_channels
        self.producers = {}  # id(tensor) -> ActivationQuantizer or None (float)
        self.inputs = {}  # id(model input) -> its quantized tensor
        self.readers = {}  # id(cloned layer) -> the layer set to read its input
        self.embeddings = {}  # id(TokenAndPositionEmbedding) -> (it, its copy): tied heads
        self.calls = {}  # layer name -> how many of its calls have an output quantizer

    def clone(self, layer):
        clone = self._clone(layer)
        if isinstance(layer, TokenAndPositionEmbedding):
            self.embeddings[id(layer)] = (layer, clone)
        return clone

    def tied_embedding(self, embedding):
        """The quantized copy of the float `embedding` (a `TokenAndPositionEmbedding`'s
        token table, copied before the head that reads it)."""
        for layer, clone in self.embeddings.values():
            if layer.token_embedding is embedding:
                return clone.token_embedding
        raise ValueError("quantize_model found no copy of the embedding a tied LM head reads: "
                         f"{embedding.name} is not the token table of a "
                         "TokenAndPositionEmbedding of the model.")

    def _clone(self, layer):
        decay, float_residual = self.decay, self.float_residual
        int8 = layer.name not in self.float_ops
        if isinstance(layer, keras.layers.Dense) and not isinstance(layer, QuantizedDense):
            return QuantizedDense(layer.units, activation=_activation(layer),
                                  weight_quantization=self.weight_quantization, decay=decay,
                                  quantize=int8, name=layer.name)
        if isinstance(layer, keras.layers.LayerNormalization) and layer.axis in (-1, [-1]) \
                and not isinstance(layer, QuantizedLayerNormalization):
            # With a float residual stream: in float, with the ops of the int8 layout.
            return QuantizedLayerNormalization(decay=decay, quantize=not float_residual,
                                               **layer.get_config())
        if isinstance(layer, keras.layers.ReversibleEmbedding) and not isinstance(
                layer, QuantizedReversibleEmbedding) and int8:
            return QuantizedReversibleEmbedding(**layer.get_config())
        if isinstance(layer, keras.layers.Embedding) and not isinstance(
                layer, (QuantizedEmbedding, QuantizedReversibleEmbedding)) and int8:
            return QuantizedEmbedding(**layer.get_config())
        if quantizable_block(layer):
            return layer.__class__.from_config({**layer.get_config(), "quantization": {
                "weight_quantization": self.weight_quantization, "decay": decay,
                "float_residual": float_residual, "quantize_output": not float_residual,
                "feedforward_float_channels": self.feedforward_float_channels,
                "float_matmuls": [matmul for matmul in layer.int8_matmuls()
                                  if f"{layer.name}/{matmul}" in self.float_ops]}})
        if isinstance(layer, TiedEmbeddingLogits) and layer.quantization is None:
            return TiedEmbeddingLogits(self.tied_embedding(layer.embedding()), name=layer.name,
                                       quantization={"decay": decay, "quantize": int8})
        if isinstance(layer, TokenAndPositionEmbedding) and layer.quantization is None:
            # With a float residual stream, the sum with the positions stays float.
            return TokenAndPositionEmbedding.from_config({**layer.get_config(), "quantization": {
                "decay": decay, "quantize": int8, "quantize_output": int8 and not float_residual}})
        return layer.__class__.from_config(layer.get_config())

    def call(self, layer, *args, **kwargs):
        args = keras.tree.map_structure(self.quantized_input, args)
        first = keras.tree.flatten(args)[0] if keras.tree.flatten(args) else None
        if isinstance(layer, QuantizedDense) or (
                quantized_layer(layer, BLOCKS) and not layer.norm_first):
            layer = self.reading(layer, self.producers.get(id(first)))
        if isinstance(layer, QuantizedReversibleEmbedding) and kwargs.get("reverse") \
                and self.producers.get(id(first)) is None:
            # The logits' matmul reads a float tensor (a float residual stream's end).
            quantizer = ActivationQuantizer(decay=self.decay,
                                            name=f"{layer.name}_reverse_input_quantizer")
            args = (quantizer(args[0]),) + args[1:]
        outputs = layer(*args, **kwargs)
        self.produced(outputs, self.output_producer(layer, outputs, first))
        if self.rounds_output(layer, outputs):
            quantizer = ActivationQuantizer(decay=self.decay,
                                            name=self.output_quantizer_name(layer))
            outputs = keras.tree.map_structure(quantizer, outputs)
            self.produced(outputs, quantizer)
        return outputs

    def rounds_output(self, layer, outputs):
        """Whether the file stores `layer`'s output in int8 and it has no quantizer yet: a
        layer of `ROUNDED`, or in an all-int8 model a float `ROUNDED_OPS` operation (a
        functional model's `x * c`, `x + y`)."""
        if isinstance(layer, ROUNDED):
            return layer.name not in self.float_ops
        return (type(layer).__name__ in ROUNDED_OPS and not self.float_residual
                and all(keras.backend.is_float_dtype(tensor.dtype)
                        for tensor in keras.tree.flatten(outputs)))

    def output_quantizer_name(self, layer):
        """`<layer>_output_quantizer`, numbered from the second call of `layer` on (a
        `ReversibleEmbedding` gathers the source and target tokens and projects)."""
        calls = self.calls[layer.name] = self.calls.get(layer.name, 0) + 1
        return f"{layer.name}_output_quantizer" + (f"_{calls - 1}" if calls > 1 else "")

    def output_producer(self, layer, outputs, first):
        """The quantizer whose int8 codes `layer`'s outputs carry (`None`: float)."""
        if _nested(layer):  # its outputs are its last layers'
            inner = keras.tree.flatten(layer.output)
            return [self.producers.get(id(tensor)) for tensor in inner]
        if isinstance(layer, QuantizedDense):
            return _int8(layer.activation_quantizer or layer.output_quantizer)
        if quantized_layer(layer, BLOCKS):
            return _int8(layer.output_quantizer())
        if quantized_layer(layer, TokenAndPositionEmbedding):
            return _int8(layer.quantizers["output_quantizer"])
        if quantized_layer(layer, TiedEmbeddingLogits):
            return _int8(layer.output_quantizer)
        if isinstance(layer, SCALE_KEEPING) or type(layer).__name__ in SCALE_KEEPING_OPS:
            return self.producers.get(id(first))
        return None

    def produced(self, outputs, producer):
        """Records `producer` (one quantizer, or one per flattened output) for `outputs`."""
        tensors = keras.tree.flatten(outputs)
        producers = producer if isinstance(producer, list) else [producer] * len(tensors)
        for tensor, quantizer in zip(tensors, producers):
            self.producers[id(tensor)] = quantizer

    def reading(self, layer, producer):
        """`layer` (a weight-matmul layer, not yet called) set to read an input whose int8
        codes `producer` made, or to round a float input itself; one per layer, so a layer
        called twice (BERT's last block) stays one layer."""
        if id(layer) not in self.readers:
            settings = ({"input_producer": producer.path} if producer is not None
                        else {"quantize_input": True})
            config = layer.get_config()
            if isinstance(layer, BLOCKS):
                config["quantization"] = {**config["quantization"], **settings}
            else:
                config.update(settings)
            self.readers[id(layer)] = layer.__class__.from_config(config)
        return self.readers[id(layer)]

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


def _int8(quantizer):
    """`quantizer` when it rounds (its tensor is int8), else `None` (float)."""
    return quantizer if quantizer.quantize else None


def _activation(dense):
    name = keras.activations.serialize(dense.activation)
    return None if name == "linear" else dense.activation


def copy_model_weights(model, qat):
    """Copies the weights of `model` to its `clone_model` copy `qat` (layers by name,
    nested models too; blocks and embeddings by weight path)."""
    for layer in model.layers:
        if not layer.weights:
            continue
        target = qat.get_layer(layer.name)
        if _nested(layer):
            copy_model_weights(layer, target)
        elif isinstance(target, TiedEmbeddingLogits):
            continue  # it reads the copied token table
        elif isinstance(target, BLOCKS + (TokenAndPositionEmbedding,)):
            copy_by_path(layer, target)
        elif isinstance(target, QuantizedDense):
            target.kernel.assign(copy_weight(layer.kernel))
            if layer.bias is not None:
                target.bias.assign(copy_weight(layer.bias))
        elif isinstance(target, QuantizedLayerNormalization):
            for name in ("gamma", "beta"):
                if getattr(layer, name) is not None:
                    getattr(target, name).assign(copy_weight(getattr(layer, name)))
        else:
            target.set_weights(layer.get_weights())


def copy_by_path(source, target, replaced=None):
    """Copies each weight of `source` to the weight of `target` at the same path below the
    layer; the quantized one of the two has quantizers besides, and every weight of the
    float one is copied. `replaced`: `{source variable path: value}` used instead."""
    replaced = replaced or {}
    targets = {variable.path.split(f"{target.name}/", 1)[-1]: variable
               for variable in target.weights}
    copied = 0
    for variable in source.weights:
        key = variable.path.split(f"{source.name}/", 1)[-1]
        if key in targets:
            targets[key].assign(copy_weight(replaced.get(variable.path, variable)))
            copied += 1
    if copied != min(len(source.weights), len(target.weights)):
        raise ValueError(f"{target.name} has not every weight of {source.name} at the same "
                         f"paths: {copied} of {min(len(source.weights), len(target.weights))}")


def copy_weight(value):
    """A NumPy copy of a weight: on JAX an assigned array would be shared, and a `fit` of
    one model, which donates its buffers, would delete the other's weights."""
    return np.array(keras.ops.convert_to_numpy(value))
