"""`float_layout_model`: a float model in the TFLite layout of its int8 copy, the graph that
the float files (fp32, fp16, dynamic-range int8) and the post-training-quantized one convert."""

import keras

from keras_attn.layers.quantized_layer_normalization import QuantizedLayerNormalization
from keras_attn.models.gpt_causal_lm import TiedEmbeddingLogits
from keras_attn.quantization.quantize_model import copy_model_weights
from keras_attn.quantization.quantize_model import quantizable_block

# Score of padded attention keys in the layout of a float file: what the model computes.
FLOAT_MASKED_SCORE = -1e9


def float_layout_model(model, masked_score=FLOAT_MASKED_SCORE):
    """`model` with each encoder block (and decoder-only block) in its int8 layout, run in
    float (`quantization={"quantize": False}`: 2-D weight matmuls, attention as two batched
    matmuls per head group, see `EncoderInt8Layout`) and each LayerNorm in the ops TFLite
    quantizes (`QuantizedLayerNormalization(quantize=False)`), the same weights, every other
    layer as it is. It computes what `model` computes; converted to TFLite it has the op layout of
    the model's int8 file (measured on MiniLM: the layout the fp32 and dynamic int8 files
    were timed with in docs/export.md).

    Args:
        model: a float functional `keras.Model` (nested models included).
        masked_score: float, the score of padded attention keys. Defaults to `-1e9` (the
            float model's). A bounded score (e.g. `-20`) keeps the converter's int8 range
            of the scores usable when it quantizes the graph after training (PTQ).

    Returns:
        A functional `keras.Model`; `model` itself when it has no block to lay out or has a
        tied LM head (`TiedEmbeddingLogits`, whose table the clone would not share).

    Example:
    >>> import numpy as np
    >>> from keras_attn.layers import TransformerEncoderBlock
    >>> inputs = keras.Input((6, 8))
    >>> block = TransformerEncoderBlock(num_heads=2, intermediate_dim=16, name="block")
    >>> model = keras.Model(inputs, block(inputs))
    >>> x = np.random.default_rng(0).normal(size=(2, 6, 8)).astype("float32")
    >>> laid_out = float_layout_model(model)
    >>> laid_out.get_layer("block").quantization["quantize"]
    False
    >>> bool(np.allclose(laid_out(x), model(x), atol=1e-5))
    True
    """
    layers = list(model._flatten_layers(include_self=False))
    if not any(quantizable_block(layer) for layer in layers) or any(
            isinstance(layer, TiedEmbeddingLogits) for layer in layers):
        return model

    def clone(layer):
        config = layer.get_config()
        if quantizable_block(layer):
            config["quantization"] = {"quantize": False, "masked_score": masked_score}
        if isinstance(layer, keras.layers.LayerNormalization) and layer.axis in (-1, [-1]):
            return QuantizedLayerNormalization(quantize=False, **config)
        return layer.__class__.from_config(config)

    laid_out = keras.models.clone_model(model, clone_function=clone, recursive=True)
    copy_model_weights(model, laid_out)
    return laid_out

