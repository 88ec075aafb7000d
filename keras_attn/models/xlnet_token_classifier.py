import keras

from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.task_model import TaskModel
from keras_attn.models.xlnet_backbone import XLNetBackbone
from keras_attn.models.xlnet_classifier import check_content_backbone


@keras.saving.register_keras_serializable(package="keras_attn")
class XLNetTokenClassifier(TaskModel):
    """Token classification (NER) on XLNet's content stream, as
    transformers' `XLNetForTokenClassification`:

        logits_t = W Dropout(h_t) + b            (B, T, num_classes)

    Args:
        backbone: a content-stream `XLNetBackbone`.
        num_classes: int, number of tags.
        dropout: float. Defaults to `0.1`.
        **kwargs: `keras.Model` arguments.

    Inputs:
        `token_ids`, `segment_ids`, `padding_mask`, `(B, T)` ints.

    Returns:
        `(B, T, num_classes)` logits.

    Example:
    >>> backbone = XLNetBackbone.from_preset("xlnet_tiny", vocabulary_size=20)
    >>> logits = XLNetTokenClassifier(backbone, num_classes=5)(
    ...     {"token_ids": np.array([[3, 4, 0]]), "segment_ids": np.zeros((1, 3)),
    ...      "padding_mask": np.array([[1, 1, 0]])})
    >>> tuple(logits.shape)
    (1, 3, 5)
    """

    backbone_class = XLNetBackbone

    def __init__(self, backbone, num_classes, dropout=0.1, **kwargs):
        check_content_backbone(backbone, "XLNetTokenClassifier")
        check_positive_int("num_classes", num_classes)
        check_rate("dropout", dropout)
        # === Layers ===
        output_dropout = keras.layers.Dropout(
            dropout, dtype=backbone.dtype_policy, name="output_dropout")
        output_dense = keras.layers.Dense(
            num_classes, kernel_initializer=keras.initializers.RandomNormal(stddev=0.02),
            dtype=backbone.dtype_policy, name="logits")

        # === Functional Model ===
        inputs = backbone.input
        h = backbone(inputs)["sequence_output"]  # (B, T, d)
        logits = output_dense(output_dropout(h))  # (B, T, num_classes)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.store_arguments(locals())
