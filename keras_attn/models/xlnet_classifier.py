import keras
from keras import ops

from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.task_model import TaskModel
from keras_attn.models.xlnet_backbone import XLNetBackbone


@keras.saving.register_keras_serializable(package="keras_attn")
class XLNetClassifier(TaskModel):
    """Sequence classification with XLNet's last-token summary (Yang et al., 2019;
    transformers' `XLNetForSequenceClassification`).

        s = tanh(W_s h_last + b_s),   logits = W Dropout(s) + b

    `h_last` is the content-stream state of each row's last real token (XLNet puts its
    `<cls>` at the end; with left padding, as XLNet's tokenizer pads, it is position
    `T - 1`; with right padding, the last position whose `padding_mask` is 1).

    Args:
        backbone: a content-stream `XLNetBackbone` (`two_stream=False`, no memory).
        num_classes: int.
        dropout: float, before the output layer. Defaults to `0.1`.
        **kwargs: `keras.Model` arguments.

    Inputs:
        `token_ids`, `segment_ids`, `padding_mask`, `(B, T)` ints.

    Returns:
        `(B, num_classes)` logits.

    Example:
    >>> backbone = XLNetBackbone.from_preset("xlnet_tiny", vocabulary_size=20)
    >>> logits = XLNetClassifier(backbone, num_classes=2)(
    ...     {"token_ids": np.array([[3, 4, 0]]), "segment_ids": np.zeros((1, 3)),
    ...      "padding_mask": np.array([[1, 1, 0]])})
    >>> tuple(logits.shape)
    (1, 2)
    """

    backbone_class = XLNetBackbone

    def __init__(self, backbone, num_classes, dropout=0.1, **kwargs):
        check_content_backbone(backbone, "XLNetClassifier")
        check_positive_int("num_classes", num_classes)
        check_rate("dropout", dropout)
        # === Layers ===
        initializer = keras.initializers.RandomNormal(stddev=0.02)
        summary = keras.layers.Dense(
            backbone.hidden_dim, activation="tanh", kernel_initializer=initializer,
            dtype=backbone.dtype_policy, name="summary")
        output_dropout = keras.layers.Dropout(
            dropout, dtype=backbone.dtype_policy, name="output_dropout")
        output_dense = keras.layers.Dense(
            num_classes, kernel_initializer=initializer, dtype=backbone.dtype_policy,
            name="logits")

        # === Functional Model ===
        inputs = backbone.input
        h = backbone(inputs)["sequence_output"]  # (B, T, d)
        padding = ops.cast(inputs["padding_mask"], "int32")  # (B, T)
        positions = ops.cumsum(ops.ones_like(padding), axis=1) - 1  # (B, T): 0 .. T-1
        last = ops.max(positions * padding, axis=1)  # (B,): last real position
        h_last = ops.take_along_axis(h, ops.reshape(last, (-1, 1, 1)), axis=1)[:, 0]  # (B, d)
        logits = output_dense(output_dropout(summary(h_last)))  # (B, num_classes)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.store_arguments(locals())


def check_content_backbone(backbone, model_name):
    """Raises unless `backbone` is an `XLNetBackbone` without query stream or memory."""
    if not isinstance(backbone, XLNetBackbone) or backbone.two_stream or (
            backbone.memory_length is not None):
        raise ValueError(
            f"{model_name} fine-tunes the content stream: it needs an XLNetBackbone with "
            "`two_stream=False` and `memory_length=None` (a pretrained two-stream "
            "backbone gives one with `.content_stream_backbone()`). "
            f"Received: backbone={type(backbone).__name__}"
            f"(two_stream={getattr(backbone, 'two_stream', None)}, "
            f"memory_length={getattr(backbone, 'memory_length', None)})")
