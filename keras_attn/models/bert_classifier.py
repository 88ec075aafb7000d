import keras

from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_backbone import bert_kernel_initializer
from keras_attn.models.bert_backbone import check_bert_backbone
from keras_attn.models.task_model import TaskModel


@keras.saving.register_keras_serializable(package="keras_attn")
class BertClassifier(TaskModel):
    """Sequence classification with BERT (Devlin et al., 2019, §4.1, GLUE).

        logits = W Dropout(pooled_output) + b,   pooled_output = tanh(W_p h_[CLS] + b_p)

    The pooled `[CLS]` state of a `BertBackbone` goes through dropout and one dense
    layer (`logits`, `num_classes` units). Train with
    `SparseCategoricalCrossentropy(from_logits=True)`.

    Args:
        backbone: a `BertBackbone`.
        num_classes: int, number of classes.
        dropout: float in [0, 1), dropout before the output layer. Defaults to `0.1`.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        The backbone's dict of `(B, T)` ints: `token_ids`, `segment_ids`, `padding_mask`.

    Returns:
        `(B, num_classes)` logits.

    Example:
    >>> backbone = BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2,
    ...                         hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> classifier = BertClassifier(backbone, num_classes=3)
    >>> logits = classifier({"token_ids": np.array([[2, 7, 9, 0]]),
    ...                      "segment_ids": np.zeros((1, 4), "int32"),
    ...                      "padding_mask": np.array([[1, 1, 1, 0]])})
    >>> tuple(logits.shape)
    (1, 3)

    `BertClassifier.from_preset(name, num_classes, dropout=0.1, **backbone_overrides)`
    (`TaskModel`'s) builds it on `BertBackbone.from_preset(name, **backbone_overrides)`.
    """

    backbone_class = BertBackbone

    def __init__(self, backbone, num_classes, dropout=0.1, **kwargs):
        check_bert_backbone(backbone)
        check_positive_int("num_classes", num_classes)
        check_rate("dropout", dropout)

        # === Layers ===
        output_dropout = keras.layers.Dropout(
            dropout, dtype=backbone.dtype_policy, name="output_dropout"
        )
        output_dense = keras.layers.Dense(
            num_classes, kernel_initializer=bert_kernel_initializer(),
            dtype=backbone.dtype_policy, name="logits",
        )

        # === Functional Model ===
        inputs = backbone.input
        pooled = backbone(inputs)["pooled_output"]  # (B, H)
        logits = output_dense(output_dropout(pooled))  # (B, num_classes)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.store_arguments(locals())
