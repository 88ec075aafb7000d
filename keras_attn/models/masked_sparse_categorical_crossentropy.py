import keras
from keras import ops

from keras_attn.layers.validation import check_int
from keras_attn.layers.validation import check_rate

# Scaling the per-position losses by (B*T) / #kept turns the base class's average over
# all positions into the average over the kept ones (the scaling Keras itself applies to
# masked losses); "sum" and "mean_with_sample_weight" are left unscaled.
_MEAN_OVER_KEPT_REDUCTIONS = ("sum_over_batch_size", "mean", "none", None)


@keras.saving.register_keras_serializable(package="keras_attn")
class MaskedSparseCategoricalCrossentropy(keras.losses.Loss):
    """Sparse categorical cross-entropy with optional label smoothing that skips
    positions labelled `ignore_class`.

    With `p = softmax(z)` over the `V` classes and label smoothing `eps`
    (Szegedy et al., 2016; `eps = 0.1` in Vaswani et al., 2017, §5.4) the target is a
    mixture of the one-hot label and the uniform distribution:

        q_v = (1 - eps) [v = y] + eps / V
        loss(y, z) = -sum_v q_v log p_v = (1 - eps) (-log p_y) + eps mean_v(-log p_v)

        loss = sum_{i: y_i != ignore_class} loss(y_i, z_i)  /  #{i: y_i != ignore_class}

    `eps = 0` (the default) is the plain sparse cross-entropy. `q` is the one of
    `keras.losses.CategoricalCrossentropy(label_smoothing=eps)`, here with sparse labels,
    so no `(B, T, V)` one-hot tensor is built; the log-softmax runs in float32.

    The mean runs over the kept positions of the whole batch, not over all `B * T`
    positions, so the amount of padding does not change the loss scale, and a batch
    without kept positions gives 0. Two conventions use it:

    - Token classification (NER) labels one token per word: the first word piece of each
      word carries the word's tag (Devlin et al., 2019, §5.3: "we use the representation
      of the first sub-token as the input to the token-level classifier"), and the other
      pieces, `[CLS]`, `[SEP]` and padding carry `-100`, the default `ignore_class`
      (transformers' `CrossEntropyLoss(ignore_index=-100)`). The same loss over `(B, P)`
      masked-LM slots whose unused slots hold `-100` is BERT's masked-LM loss.
    - Sequence-to-sequence training ignores the padding id of the labels:
      `MaskedSparseCategoricalCrossentropy(ignore_class=pad_id, label_smoothing=0.1)`.

    Args:
        ignore_class: optional int, the label of positions that carry no loss; `None`
            counts every position. Defaults to `-100`.
        label_smoothing: float in [0, 1), `eps` above. Defaults to `0.0`.
        from_logits: bool, `y_pred` holds logits (`True`) or probabilities (clipped to
            `[epsilon, 1 - epsilon]` before the log, as Keras does). Defaults to `True`.
        reduction: a Keras reduction. `"sum_over_batch_size"` (the default) and `"mean"`
            give the mean over kept positions above (with `sample_weight`,
            `sum(loss * w) / #kept`); `"none"` returns the per-position losses with 0 at
            ignored positions, scaled so that their mean is the loss; `"sum"` their
            unscaled sum; `"mean_with_sample_weight"` `sum(loss * w) / sum(w)`.
        name: str. Defaults to `"masked_sparse_categorical_crossentropy"`.
        dtype: dtype of the computation. Defaults to float32.

    Call arguments:
        y_true: `(B, T)` int labels (any shape one rank below `y_pred`); `ignore_class`
            where no loss.
        y_pred: `(B, T, V)` logits or probabilities.
        sample_weight: optional weights broadcastable to `y_true`.

    Returns:
        The scalar loss (with the default reduction).

    Example:
    >>> loss = MaskedSparseCategoricalCrossentropy()
    >>> logits = keras.ops.log(keras.ops.array([[[0.5, 0.5], [0.9, 0.1], [0.2, 0.8]]]))
    >>> round(float(loss(np.array([[0, -100, 1]]), logits)), 4)   # mean of -log .5, -log .8
    0.4581
    >>> smoothed = MaskedSparseCategoricalCrossentropy(ignore_class=0, label_smoothing=0.5)
    >>> logits = keras.ops.log(keras.ops.array([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]]))
    >>> round(float(smoothed(np.array([[2, 0]]), logits)), 4)  # .5 (-log .25) + .5 mean(-log p)
    1.2708
    """

    def __init__(
        self,
        ignore_class=-100,
        label_smoothing=0.0,
        from_logits=True,
        reduction="sum_over_batch_size",
        name="masked_sparse_categorical_crossentropy",
        dtype=None,
    ):
        check_int("ignore_class", ignore_class,
                  meaning="a label value, e.g. -100 or the padding id", optional=True)
        check_rate("label_smoothing", label_smoothing)
        super().__init__(name=name, reduction=reduction, dtype=dtype)
        self.ignore_class = ignore_class
        self.label_smoothing = label_smoothing
        self.from_logits = from_logits

    def call(self, y_true, y_pred):
        y_pred = ops.cast(y_pred, "float32")  # (B, T, V)
        y_true = ops.cast(y_true, "int32")  # (B, T)
        if not self.from_logits:
            epsilon = keras.config.epsilon()
            # log_softmax below renormalises probabilities that do not sum to 1.
            y_pred = ops.log(ops.clip(y_pred, epsilon, 1.0 - epsilon))  # (B, T, V)
        log_probs = ops.log_softmax(y_pred, axis=-1)  # (B, T, V)
        if self.ignore_class is None:
            kept = ops.ones_like(y_true, dtype="bool")  # (B, T)
        else:
            kept = ops.not_equal(y_true, self.ignore_class)  # (B, T)
        safe_labels = ops.where(kept, y_true, 0)  # (B, T), any in-range class at ignored
        true_log_prob = ops.take_along_axis(
            log_probs, safe_labels[..., None], axis=-1
        )[..., 0]  # (B, T)
        losses = -(1.0 - self.label_smoothing) * true_log_prob  # (B, T)
        if self.label_smoothing:
            losses = losses - self.label_smoothing * ops.mean(log_probs, axis=-1)  # (B, T)
        kept = ops.cast(kept, "float32")  # (B, T)
        losses = losses * kept  # (B, T)
        if self.reduction in _MEAN_OVER_KEPT_REDUCTIONS:
            total = ops.cast(ops.size(kept), "float32")
            losses = losses * ops.divide_no_nan(total, ops.sum(kept))
        return losses

    def get_config(self):
        return {
            "name": self.name,
            "reduction": self.reduction,
            "ignore_class": self.ignore_class,
            "label_smoothing": self.label_smoothing,
            "from_logits": self.from_logits,
            "dtype": self.dtype,
        }
