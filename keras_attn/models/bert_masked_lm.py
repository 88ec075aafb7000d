import keras

from keras_attn.models.bert_backbone import BertBackbone
from keras_attn.models.bert_backbone import check_bert_backbone
from keras_attn.models.masked_lm_head import MaskedLMHead
from keras_attn.models.task_model import TaskModel


@keras.saving.register_keras_serializable(package="keras_attn")
class BertMaskedLM(TaskModel):
    """BERT with its masked-language-model head (Devlin et al., 2019, §3.1, Task #1).

        logits[b, p] = MaskedLMHead(sequence_output)[b, mask_positions[b, p]]   (B, P, V)

    The output matrix is tied to the backbone's token embedding (see `MaskedLMHead`).
    Only the `P` masked positions are projected onto the vocabulary, which is what keeps
    pretraining affordable (`P` is about 15 % of `T`). Train with
    `MaskedSparseCategoricalCrossentropy()` and labels `(B, P)` holding the original
    token ids, `-100` in unused mask slots (the mean then runs over the real masked
    positions, as BERT's `masked_lm_weights` do).

    Args:
        backbone: a `BertBackbone`.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        The backbone's dict plus `mask_positions`, `(B, P)` ints.

    Returns:
        `(B, P, vocabulary_size)` logits.

    Example:
    >>> backbone = BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2,
    ...                         hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> mlm = BertMaskedLM(backbone)
    >>> logits = mlm({"token_ids": np.array([[2, 4, 9, 3]]),
    ...               "segment_ids": np.zeros((1, 4), "int32"),
    ...               "padding_mask": np.ones((1, 4), "int32"),
    ...               "mask_positions": np.array([[1, 2]])})
    >>> tuple(logits.shape)
    (1, 2, 50)

    `BertMaskedLM.from_preset(name, **backbone_overrides)` (`TaskModel`'s) builds it on
    `BertBackbone.from_preset(name, **backbone_overrides)`.
    """

    backbone_class = BertBackbone

    def __init__(self, backbone, **kwargs):
        check_bert_backbone(backbone)

        # The masked-LM logits do not read the pooled output: a frozen pooler is neither
        # tracked by the optimizer nor reported as getting no gradient.
        backbone.get_layer("pooled_dense").trainable = False

        # === Layers ===
        masked_lm_head = MaskedLMHead(
            token_embedding=backbone.token_embedding,
            intermediate_activation=backbone.activation,
            layer_norm_epsilon=backbone.layer_norm_epsilon,
            dtype=backbone.dtype_policy, name="masked_lm_head",
        )

        # === Functional Model ===
        inputs = dict(backbone.input)
        inputs["mask_positions"] = keras.Input(
            shape=(None,), dtype="int32", name="mask_positions"
        )
        sequence = backbone(
            {k: inputs[k] for k in ("token_ids", "segment_ids", "padding_mask")}
        )["sequence_output"]  # (B, T, H)
        logits = masked_lm_head(
            sequence, mask_positions=inputs["mask_positions"]
        )  # (B, P, V)
        super().__init__(inputs=inputs, outputs=logits, **kwargs)

        # === Config ===
        self.backbone = backbone
        self.masked_lm_head = masked_lm_head
