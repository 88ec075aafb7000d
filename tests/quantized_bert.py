"""Tiny quantization-aware BERT task models for the tests: `quantize_model` copies of a
`BertClassifier` or `BertTokenClassifier` as `QuantizedModel`s."""

from keras_attn.models import BertBackbone
from keras_attn.models import BertClassifier
from keras_attn.models import BertTokenClassifier
from keras_attn.quantization import QuantizedModel
from keras_attn.quantization import quantize_model


def quantized_bert(vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim,
                   max_sequence_length, num_outputs, head="classification", use_crf=False,
                   float_ops=(), **settings):
    """An uncalibrated `QuantizedModel` of a fresh tiny BERT classifier or tagger
    (`calibrate(batches)` sets its ranges)."""
    backbone = BertBackbone(vocabulary_size=vocabulary_size, num_layers=num_layers,
                            num_heads=num_heads, hidden_dim=hidden_dim,
                            intermediate_dim=intermediate_dim,
                            max_sequence_length=max_sequence_length)
    model = (BertClassifier(backbone, num_classes=num_outputs) if head == "classification"
             else BertTokenClassifier(backbone, num_labels=num_outputs, use_crf=use_crf))
    return from_float(model, float_ops=float_ops, **settings)


def from_float(model, float_ops=(), **settings):
    """The uncalibrated `QuantizedModel` of a float `model`."""
    return QuantizedModel(quantize_model(model, float_ops=float_ops, **settings), [],
                          float_ops, **settings)
