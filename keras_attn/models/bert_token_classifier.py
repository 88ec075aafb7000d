import keras
from keras import ops

from keras_attn.layers.crf import CRF
from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_backbone import bert_kernel_initializer
from keras_attn.models.bert_backbone import check_bert_backbone
from keras_attn.models.task_model import TaskModel

IGNORE_INDEX = -100


@keras.saving.register_keras_serializable(package="keras_attn")
class BertTokenClassifier(TaskModel):
    """Token classification (NER) with BERT (Devlin et al., 2019, §5.3, CoNLL-2003).

        logits_t = W Dropout(h_t) + b                       (B, T, num_labels)

    Labels follow the first-sub-token convention of the paper: the first word piece of
    each word carries the word's tag; the other pieces, `[CLS]`, `[SEP]` and padding
    carry `-100` (`IGNORE_INDEX`) and no loss. Train the plain model with
    `MaskedSparseCategoricalCrossentropy()` (its `ignore_class` is `-100`).

    With `use_crf=True` a linear-chain CRF (`keras_attn.layers.CRF`, Lample et al., 2016)
    scores tag bigrams on top of the logits, which become its emission scores. The CRF
    chain runs over the labelled tokens only — the first pieces of the words — so the
    model takes one more input, `label_mask` `(B, T)`: 1 at the tokens whose tag is
    predicted, 0 elsewhere (the positions labelled `-100` in training data). Its outputs
    are then a dict: `logits` (the emissions) and `tags`, the Viterbi path `(B, T)` int32
    over `label_mask` (0 elsewhere), which is what an exported model serves. The CRF
    loss is built in (`compute_loss`, the mean negative log-likelihood of the gold
    paths over the positions whose label is not `-100`): compile with only an optimizer
    and pass the `(B, T)` labels as `y`.

    Args:
        backbone: a `BertBackbone`.
        num_labels: int, number of tags `K`.
        dropout: float in [0, 1), dropout before the output layer. Defaults to `0.1`.
        use_crf: bool, add the CRF. Defaults to `False`.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        The backbone's dict of `(B, T)` ints; with `use_crf`, also `label_mask`.

    Returns:
        `(B, T, num_labels)` logits; with `use_crf`, a dict `{"logits", "tags"}`.

    Example:
    >>> backbone = BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2,
    ...                         hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> tagger = BertTokenClassifier(backbone, num_labels=5)
    >>> x = {"token_ids": np.array([[2, 7, 9, 3]]), "segment_ids": np.zeros((1, 4), "int32"),
    ...      "padding_mask": np.ones((1, 4), "int32")}
    >>> tuple(tagger(x).shape)
    (1, 4, 5)
    >>> crf_tagger = BertTokenClassifier(backbone, num_labels=5, use_crf=True)
    >>> out = crf_tagger({**x, "label_mask": np.array([[0, 1, 1, 0]])})
    >>> tuple(out["tags"].shape), keras.backend.standardize_dtype(out["tags"].dtype)
    ((1, 4), 'int32')

    `BertTokenClassifier.from_preset(name, num_labels, dropout=0.1, use_crf=False,
    **backbone_overrides)` (`TaskModel`'s) builds it on
    `BertBackbone.from_preset(name, **backbone_overrides)`.
    """

    backbone_class = BertBackbone

    def __init__(self, backbone, num_labels, dropout=0.1, use_crf=False, **kwargs):
        check_bert_backbone(backbone)
        check_positive_int("num_labels", num_labels)
        check_rate("dropout", dropout)
        check_bool("use_crf", use_crf)

        # The token logits do not read the pooled output: a frozen pooler is neither tracked
        # by the optimizer nor reported as getting no gradient, also in a loaded model.
        backbone.get_layer("pooled_dense").trainable = False

        # === Layers ===
        output_dropout = keras.layers.Dropout(
            dropout, dtype=backbone.dtype_policy, name="output_dropout"
        )
        output_dense = keras.layers.Dense(
            num_labels, kernel_initializer=bert_kernel_initializer(),
            dtype=backbone.dtype_policy, name="logits",
        )
        crf = CRF(num_labels, dtype=backbone.dtype_policy, name="crf") if use_crf else None

        # === Functional Model ===
        inputs = dict(backbone.input)
        sequence = backbone(inputs)["sequence_output"]  # (B, T, H)
        logits = output_dense(output_dropout(sequence))  # (B, T, K)
        outputs = logits
        if use_crf:
            inputs["label_mask"] = keras.Input(shape=(None,), dtype="int32", name="label_mask")
            decode_mask = ops.cast(inputs["label_mask"], "bool")  # (B, T)
            tags = crf(logits, mask=decode_mask)  # (B, T) int32
            outputs = {"logits": logits, "tags": tags}
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)

        # === Config ===
        self.store_arguments(locals())
        self.crf = crf

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None,
               **kwargs):
        """`keras.Model.export`, refusing `format="onnx"` with `use_crf=True`: the CRF's
        Viterbi loop writes its path with `XlaDynamicUpdateSlice`, which tf2onnx cannot
        convert (it would write a file that onnxruntime cannot run)."""
        if format == "onnx" and self.use_crf:
            raise ValueError(
                "BertTokenClassifier(use_crf=True) cannot be exported with "
                "`model.export(format='onnx')`: the CRF's Viterbi decoding loop uses "
                "XlaDynamicUpdateSlice, which tf2onnx does not convert. Use `keras-attn "
                "export` (or `keras_attn.export.export_onnx`), which exports the emission "
                "scores and decodes the CRF outside the graph, or `format='litert'`, where "
                "the whole decoder runs. Received: format='onnx', use_crf=True"
            )
        return super().export(filepath, format=format, verbose=verbose,
                              input_signature=input_signature, **kwargs)

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """With `use_crf`: `-mean_b log p(y_b | logits_b)` over the positions labelled
        other than `-100`, or `-sum_b w_b log p(y_b | logits_b)` with a `(B,)`
        `sample_weight` (the training pipeline's weights, already divided by the size of the
        global batch, so that replica losses add up to the global mean). Without: the
        compiled loss (Keras' default)."""
        if not self.use_crf:
            return super().compute_loss(x, y, y_pred, sample_weight, training)
        return crf_loss(self, y, y_pred, sample_weight)


def crf_loss(model, y, y_pred, sample_weight=None):
    """The CRF tagger's loss: `-mean_b log p(y_b | logits_b)` over the positions labelled
    other than `-100` (or `-sum_b w_b log p(...)` with a `(B,)` `sample_weight`), plus the
    model's own losses. Shared by `BertTokenClassifier` and its `quantize_model` copy
    (`CrfTaggerCopy`).

    Args:
        model: a model with a `crf` layer and `losses`.
        y: `(B, T)` int labels, `-100` where no tag.
        y_pred: the model's outputs, a dict with the `(B, T, K)` emissions `logits`.
        sample_weight: optional `(B,)` weights.

    Returns:
        The scalar loss.
    """
    if isinstance(y, dict) or y is None:
        raise ValueError(
            f"{type(model).__name__}(use_crf=True) computes the CRF loss itself from the "
            "(B, T) int labels (-100 where no tag): pass them as `y`. "
            f"Received: y={type(y).__name__}"
        )
    labels = ops.cast(y, "int32")  # (B, T)
    labelled = ops.not_equal(labels, IGNORE_INDEX)  # (B, T)
    gold = ops.where(labelled, labels, 0)  # (B, T)
    log_likelihood = model.crf.log_likelihood(y_pred["logits"], gold, mask=labelled)  # (B,)
    if sample_weight is None:
        total = -ops.mean(log_likelihood)
    else:
        weights = ops.reshape(ops.cast(sample_weight, "float32"), (-1,))  # (B,)
        total = -ops.sum(log_likelihood * weights)
    for loss in model.losses:
        total = total + ops.cast(loss, "float32")
    return total
