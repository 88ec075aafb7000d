"""`dequantize_model`: the float model of a `quantize_model` copy, with the copy's weights (after
QAT, the fine-tuned float model; before, the model `quantize_model` was given)."""

import keras

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.quantized_dense import QuantizedDense
from keras_attn.layers.quantized_embedding import QuantizedEmbedding
from keras_attn.layers.quantized_layer_normalization import QuantizedLayerNormalization
from keras_attn.layers.quantized_reversible_embedding import QuantizedReversibleEmbedding
from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.models.gpt_causal_lm import TiedEmbeddingLogits
from keras_attn.quantization.crf_tagger_copy import with_crf_loss
from keras_attn.quantization.model_queries import BLOCKS
from keras_attn.quantization.quantize_model import copy_by_path
from keras_attn.quantization.quantize_model import copy_weight


def dequantize_model(qat):
    """The float form of a `quantize_model` copy: every quantized layer back to its float
    class (`QuantizedDense` -> `Dense`, `QuantizedEmbedding` -> `Embedding`,
    `QuantizedLayerNormalization` -> `LayerNormalization`, the blocks, embeddings and tied
    head without `quantization`), the `ActivationQuantizer`s left out, the weights the
    copy's (the feed-forward channels in their float order again).

    `dequantize_model(quantize_model(model))` computes what `model` computes, with the same
    weights; after QAT (`fit` on the copy) it is the fine-tuned float model.

    Args:
        qat: a `keras_attn.quantization.quantize_model` copy (not changed).

    Returns:
        A functional `keras.Model` with the copy's inputs and outputs.

    Example:
    >>> inputs = keras.Input((4,))
    >>> model = keras.Model(inputs, keras.layers.Dense(2)(inputs))
    >>> from keras_attn.quantization import quantize_model
    >>> float_again = dequantize_model(quantize_model(model))
    >>> [type(layer).__name__ for layer in float_again.layers]
    ['InputLayer', 'Dense']
    """
    graph = _FloatGraph()
    model = keras.models.clone_model(qat, clone_function=graph.clone,
                                     call_function=graph.call, recursive=True)
    copy_float_weights(qat, model)
    return with_crf_loss(model)


class _FloatGraph:
    """`dequantize_model`'s `clone_model` functions."""

    def __init__(self):
        self.embeddings = []  # (embedding layer of the copy, its float clone)

    def clone(self, layer):
        config = layer.get_config()
        if isinstance(layer, QuantizedDense):
            return keras.layers.Dense(layer.units, activation=layer.activation,
                                      name=layer.name)
        if isinstance(layer, QuantizedEmbedding):
            return keras.layers.Embedding(**config)
        if isinstance(layer, QuantizedReversibleEmbedding):
            return keras.layers.ReversibleEmbedding(**config)
        if isinstance(layer, QuantizedLayerNormalization):
            del config["decay"], config["quantize"]
            return keras.layers.LayerNormalization(**config)
        if isinstance(layer, TiedEmbeddingLogits):
            clone = next(clone for original, clone in self.embeddings
                         if original.token_embedding is layer.embedding())
            return TiedEmbeddingLogits(clone.token_embedding, name=layer.name)
        if isinstance(layer, BLOCKS + (TokenAndPositionEmbedding,)):
            config.pop("quantization", None)
        clone = layer.__class__.from_config(config)
        if isinstance(layer, TokenAndPositionEmbedding):
            self.embeddings.append((layer, clone))
        return clone

    def call(self, layer, *args, **kwargs):
        if isinstance(layer, ActivationQuantizer):
            return args[0]  # the float model does not round
        return layer(*args, **kwargs)


def copy_float_weights(qat, model):
    """Copies the weights of a `quantize_model` copy `qat` to its float model `model` (a
    `dequantize_model` of it), the feed-forward channels in their float order."""
    for layer in model.layers:
        if not layer.weights or isinstance(layer, TiedEmbeddingLogits):
            continue  # a tied head reads its embedding's table
        source = qat.get_layer(layer.name)
        if isinstance(layer, keras.Model):
            copy_float_weights(source, layer)
        elif isinstance(layer, BLOCKS + (TokenAndPositionEmbedding,)):
            _copy_float_order(source, layer)
        elif isinstance(source, QuantizedDense):
            layer.kernel.assign(copy_weight(source.kernel))
            layer.bias.assign(copy_weight(source.bias))
        elif isinstance(source, QuantizedLayerNormalization):
            layer.set_weights([w for w in (source.gamma, source.beta) if w is not None])
        else:
            layer.set_weights(source.get_weights())


def _copy_float_order(source, target):
    """The float layer's weights from the quantized one's, the feed-forward channels in
    their float order."""
    quantized_block = isinstance(source, BLOCKS) and source.quantization is not None
    copy_by_path(source, target,
                 source.float_order_feedforward_weights() if quantized_block else None)
