import keras
from keras import ops

from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_backbone import bert_kernel_initializer
from keras_attn.models.bert_backbone import check_bert_backbone
from keras_attn.models.masked_lm_head import MaskedLMHead
from keras_attn.models.task_model import TaskModel

TARGET_KEYS = ("mask_ids", "mask_weights", "next_sentence_labels")


@keras.saving.register_keras_serializable(package="keras_attn")
class BertPretrainer(TaskModel):
    """BERT pretraining: masked LM + next-sentence prediction (Devlin et al., 2019, §3.1).

        L = L_MLM + L_NSP
        L_MLM = sum_{b,p} w_bp CE(mlm_logits_bp, mask_ids_bp) / sum_{b,p} w_bp
        L_NSP = mean_b CE(nsp_logits_b, next_sentence_labels_b)

    the loss of Google's `run_pretraining.py` (`masked_lm_weights` are 1 for real mask
    slots and 0 for padding slots). The masked-LM head is `MaskedLMHead`, tied to the
    token embedding; the NSP head (`next_sentence_head`, `cls/seq_relationship` in the
    original code) is a 2-way dense layer on the pooled `[CLS]` state, class 0 = IsNext
    (sentence B follows A), 1 = NotNext (B is a random sentence).

    The loss is built in (`compute_loss`): compile with only an optimizer and give `fit`
    a target dict `{"mask_ids": (B, P) ints, "mask_weights": (B, P) floats,
    "next_sentence_labels": (B,) ints}`.

    Args:
        backbone: a `BertBackbone`.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        The backbone's dict plus `mask_positions`, `(B, P)` ints.

    Returns:
        A dict: `mlm_logits` `(B, P, V)` and `nsp_logits` `(B, 2)`.

    Example:
    >>> backbone = BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2,
    ...                         hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> pretrainer = BertPretrainer(backbone)
    >>> x = {"token_ids": np.array([[2, 4, 9, 3]]), "segment_ids": np.array([[0, 0, 1, 1]]),
    ...      "padding_mask": np.ones((1, 4), "int32"), "mask_positions": np.array([[1, 0]])}
    >>> y = {"mask_ids": np.array([[7, 0]]), "mask_weights": np.array([[1.0, 0.0]]),
    ...      "next_sentence_labels": np.array([0])}
    >>> pretrainer.compile(optimizer="adam")
    >>> history = pretrainer.fit(x, y, epochs=2, verbose=0)
    >>> tuple(pretrainer.predict(x, verbose=0)["nsp_logits"].shape)
    (1, 2)

    `BertPretrainer.from_preset(name, **backbone_overrides)` (`TaskModel`'s) builds it on
    `BertBackbone.from_preset(name, **backbone_overrides)`.
    """

    backbone_class = BertBackbone

    def __init__(self, backbone, **kwargs):
        check_bert_backbone(backbone)

        # === Layers ===
        masked_lm_head = MaskedLMHead(
            token_embedding=backbone.token_embedding,
            intermediate_activation=backbone.activation,
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            dtype=backbone.dtype_policy, name="masked_lm_head",
        )
        next_sentence_head = keras.layers.Dense(
            2, kernel_initializer=bert_kernel_initializer(), dtype=backbone.dtype_policy,
            name="next_sentence_head",
        )

        # === Functional Model ===
        inputs = dict(backbone.input)
        inputs["mask_positions"] = keras.Input(
            shape=(None,), dtype="int32", name="mask_positions"
        )
        outputs = backbone(
            {k: inputs[k] for k in ("token_ids", "segment_ids", "padding_mask")}
        )
        mlm_logits = masked_lm_head(
            outputs["sequence_output"], mask_positions=inputs["mask_positions"]
        )  # (B, P, V)
        nsp_logits = next_sentence_head(outputs["pooled_output"])  # (B, 2)
        super().__init__(
            inputs=inputs,
            outputs={"mlm_logits": mlm_logits, "nsp_logits": nsp_logits},
            **kwargs,
        )

        # === Config ===
        self.store_arguments(locals())
        self.masked_lm_head = masked_lm_head
        self.next_sentence_head = next_sentence_head

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        """`L_MLM + L_NSP` (see the class docstring), plus any layer losses.

        With `sample_weight={"mlm": (B, P), "nsp": (B,)}` (the training pipeline's weights,
        each already divided by its total over the global batch) the terms are the
        weighted sums instead of the per-batch means, so replica losses add up to the
        global-batch loss under `tf.distribute` and gradient accumulation."""
        if not isinstance(y, dict) or any(key not in y for key in TARGET_KEYS):
            received = sorted(y) if isinstance(y, dict) else type(y).__name__
            raise ValueError(
                f"BertPretrainer computes its own loss from the targets {TARGET_KEYS}: pass "
                "y={'mask_ids': (B, P) ints, 'mask_weights': (B, P) floats, "
                "'next_sentence_labels': (B,) ints} to fit/evaluate. "
                f"Received: y={received}"
            )
        mlm_losses = keras.losses.sparse_categorical_crossentropy(
            y["mask_ids"], ops.cast(y_pred["mlm_logits"], "float32"), from_logits=True
        )  # (B, P)
        weights = ops.cast(y["mask_weights"], "float32")  # (B, P)
        nsp_losses = keras.losses.sparse_categorical_crossentropy(
            y["next_sentence_labels"], ops.cast(y_pred["nsp_logits"], "float32"),
            from_logits=True,
        )  # (B,)
        if isinstance(sample_weight, dict) and set(sample_weight) == {"mlm", "nsp"}:
            mlm_loss = ops.sum(mlm_losses * ops.cast(sample_weight["mlm"], "float32"))
            nsp_loss = ops.sum(nsp_losses * ops.cast(sample_weight["nsp"], "float32"))
        else:
            mlm_loss = ops.divide_no_nan(ops.sum(mlm_losses * weights), ops.sum(weights))
            nsp_loss = ops.mean(nsp_losses)
        total = mlm_loss + nsp_loss
        for loss in self.losses:
            total = total + ops.cast(loss, "float32")
        return total
