"""`CrfTaggerCopy`: the functional copy of a CRF tagger that trains through the CRF loss."""

import keras

from keras_attn.layers.crf import CRF
from keras_attn.models.bert_token_classifier import crf_loss


@keras.saving.register_keras_serializable(package="keras_attn")
class CrfTaggerCopy(keras.Model):
    """A functional model whose outputs are a CRF tagger's dict (`logits`: the emissions,
    `tags`: the Viterbi tags over `label_mask`), trained by the mean negative
    log-likelihood of the gold tags (`crf_loss`, Lample et al., 2016) as
    `BertTokenClassifier(use_crf=True)` is. `quantize_model` and `dequantize_model` return
    one for a model with a CRF: `keras.models.clone_model` keeps the layers, not the
    tagger's `compute_loss`.

    Args:
        inputs, outputs: the functional graph (outputs: a dict with `logits` and `tags`).
        **kwargs: `keras.Model` arguments (`name`).

    Example:
    >>> import numpy as np
    >>> from keras_attn.models import BertBackbone, BertTokenClassifier
    >>> from keras_attn.quantization import quantize_model
    >>> backbone = BertBackbone(vocabulary_size=30, num_layers=1, num_heads=2, hidden_dim=8,
    ...                         intermediate_dim=16, max_sequence_length=8)
    >>> qat = quantize_model(BertTokenClassifier(backbone, num_labels=3, use_crf=True))
    >>> type(qat).__name__, qat.crf.name
    ('CrfTaggerCopy', 'crf')
    """

    def __init__(self, inputs, outputs, name=None, **kwargs):
        # Functional's own arguments: Keras saves and revives it as a functional model.
        super().__init__(inputs=inputs, outputs=outputs, name=name, **kwargs)

    @property
    def crf(self):
        """The CRF layer (its transitions score the tag sequences)."""
        (crf,) = [layer for layer in self._flatten_layers(include_self=False)
                  if isinstance(layer, CRF)]
        return crf

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        return crf_loss(self, y, y_pred, sample_weight)


def with_crf_loss(model):
    """`model` as a `CrfTaggerCopy` (same graph, layers and weights) when it holds a CRF and
    returns its dict of `logits` and `tags`; else `model` itself."""
    has_crf = any(isinstance(layer, CRF) for layer in model._flatten_layers(include_self=False))
    if not has_crf or not isinstance(model.output, dict) or isinstance(model, CrfTaggerCopy):
        return model
    return CrfTaggerCopy(model.input, model.output, name=model.name)
