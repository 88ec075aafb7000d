"""Int8 quantization: the `QuantizationRecipe` (a setting of the run contract), the quantize stage
(`keras_attn.stages.quantize_run`, `keras-attn quantize RUN`, is a stage above this
library) and quantization-aware training
(QAT) of functional or Sequential Keras models of Keras and keras-attn layers, our task
models included (`quantize_model`, `QuantizedModel`), for full-integer TFLite export: fake
int8 quantization (`keras.quantizers.fake_quant_with_min_max_vars`) of every tensor the
int8 graph stores, in the layout the TFLite int8 kernels want."""

from keras_attn.layers.activation_quantizer import ActivationQuantizer
from keras_attn.layers.quantized_dense import QuantizedDense
from keras_attn.layers.quantized_embedding import QuantizedEmbedding
from keras_attn.layers.quantized_layer_normalization import QuantizedLayerNormalization
from keras_attn.layers.quantized_reversible_embedding import QuantizedReversibleEmbedding
from keras_attn.quantization.calibration import calibrate_model
from keras_attn.quantization.crf_tagger_copy import CrfTaggerCopy
from keras_attn.quantization.dequantize_model import dequantize_model
from keras_attn.quantization.quantize_model import quantize_model
from keras_attn.quantization.quantized_model import QuantizedModel
from keras_attn.quantization.quantized_weights import copy_quantized_weights
from keras_attn.runs.quantization_recipe import QuantizationRecipe

__all__ = [
    "ActivationQuantizer",
    "CrfTaggerCopy",
    "QuantizedDense",
    "QuantizedEmbedding",
    "QuantizedReversibleEmbedding",
    "QuantizedLayerNormalization",
    "QuantizationRecipe",
    "QuantizedModel",
    "calibrate_model",
    "copy_quantized_weights",
    "dequantize_model",
    "quantize_model",
]

