import keras

from keras_attn.layers.token_and_position_embedding import TokenAndPositionEmbedding
from keras_attn.layers.transformer_encoder_block import TransformerEncoderBlock
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.models.backbone import Backbone
from keras_attn.models.model_arguments import check_transformer_sizes

# Architectures of the published BERT family (weights are imported separately, see
# `keras_attn.checkpoints`). Sizes from Devlin et al. (2019) for base/large, Turc et al.
# (2019, "Well-Read Students Learn Better") for tiny/mini/small, and the config.json of
# sentence-transformers/all-MiniLM-L6-v2 (Wang et al., 2020, "MiniLM") for minilm_l6_h384.
BERT_PRESETS = {
    "bert_tiny": dict(num_layers=2, hidden_dim=128, num_heads=2, intermediate_dim=512),
    "bert_mini": dict(num_layers=4, hidden_dim=256, num_heads=4, intermediate_dim=1024),
    "bert_small": dict(num_layers=4, hidden_dim=512, num_heads=8, intermediate_dim=2048),
    "bert_base": dict(num_layers=12, hidden_dim=768, num_heads=12, intermediate_dim=3072),
    "bert_large": dict(num_layers=24, hidden_dim=1024, num_heads=16, intermediate_dim=4096),
    "minilm_l6_h384": dict(num_layers=6, hidden_dim=384, num_heads=12, intermediate_dim=1536),
}
for _config in BERT_PRESETS.values():
    _config.update(vocabulary_size=30522, max_sequence_length=512, num_segments=2)
del _config


def bert_kernel_initializer():
    """BERT's initializer for every weight matrix: `TruncatedNormal(stddev=0.02)`."""
    return keras.initializers.TruncatedNormal(stddev=0.02)


@keras.saving.register_keras_serializable(package="keras_attn")
class BertBackbone(Backbone):
    """BERT encoder (Devlin et al., 2019, "BERT: Pre-training of Deep Bidirectional
    Transformers for Language Understanding", §3 and Fig. 2).

        E = LayerNorm(TokenEmb(x) + SegmentEmb(s) + PosEmb(t))      (B, T, H)
        h_0 = Dropout(E);  h_l = PostLNEncoderBlock_l(h_{l-1}, padding_mask)
        sequence_output = h_L                                       (B, T, H)
        pooled_output = tanh(W_p h_L[:, 0] + b_p)                   (B, H), the [CLS] row

    A functional `keras.Model` whose layers carry the names checkpoint importers look
    up: `embeddings` (a `TokenAndPositionEmbedding` with sublayers `token_embedding`,
    `segment_embedding`, `position_embedding`), `embeddings_layer_norm`,
    `embeddings_dropout`, `transformer_layer_{i}` (post-LN `TransformerEncoderBlock`s,
    `transformer_layers`) and `pooled_dense`. `BERT_PRESETS` holds the published sizes;
    `from_preset` (`Backbone`'s) builds one with fresh weights
    (`keras_attn.checkpoints.load_hf_bert` and `load_google_bert` import pretrained ones).

    `pooled_output` comes from a second call of the last block with only the [CLS] row as
    query (`query_length=1`, same weights, same values): a model that reads only the
    pooled output, like `BertClassifier`, skips the other `T - 1` rows of the last block
    once traced (about 21 % of the training FLOPs of a 4-layer encoder at sequence 128).
    Eager calls compute both branches.

    Q, K and V are projected with one fused `(H, 3, heads, d_k)` kernel by default
    (`fused_qkv=True`): one matmul instead of three, which is faster on CPU (about 8 %
    for a 4-layer, 256-wide encoder at sequence 128, batch 32, on 2 cores) and puts the
    three projections behind a single quantization point for int8 export. The checkpoint
    importers concatenate the published Q, K and V matrices into it.

    Args:
        vocabulary_size: int, number of token ids.
        num_layers: int, number of encoder blocks `L`.
        num_heads: int, attention heads per block `A`; must divide `hidden_dim`.
        hidden_dim: int, model width `H`.
        intermediate_dim: int, feed-forward width (`4H` in BERT).
        max_sequence_length: int, size of the learned position table. Defaults to `512`.
        num_segments: int, number of segment (token type) ids. Defaults to `2`.
        dropout: float in [0, 1), dropout on embeddings, attention probabilities and
            residual branches. Defaults to `0.1`.
        activation: feed-forward activation; `"gelu"` is the exact (erf) GELU of the
            published checkpoints, `"gelu_approximate"` the tanh form. Defaults to `"gelu"`.
        layer_norm_epsilon: float > 0. Defaults to `1e-12` (BERT's).
        fused_qkv: bool, one fused Q/K/V kernel per block. Defaults to `True`.
        dtype: dtype policy of the layers (`"mixed_float16"`, ...). Defaults to the
            global policy.
        **kwargs: `keras.Model` arguments (`name`, `trainable`).

    Inputs:
        A dict of `(B, T)` int tensors: `token_ids`; `segment_ids` (0 for sentence A,
        1 for sentence B); `padding_mask` (1 for real tokens, 0 for padding).

    Returns:
        A dict: `sequence_output` `(B, T, H)` and `pooled_output` `(B, H)`.

    Example:
    >>> model = BertBackbone(vocabulary_size=50, num_layers=1, num_heads=2,
    ...                      hidden_dim=8, intermediate_dim=16, max_sequence_length=16)
    >>> out = model({"token_ids": np.array([[2, 7, 9, 0]]),
    ...              "segment_ids": np.zeros((1, 4), "int32"),
    ...              "padding_mask": np.array([[1, 1, 1, 0]])})
    >>> tuple(out["sequence_output"].shape), tuple(out["pooled_output"].shape)
    ((1, 4, 8), (1, 8))
    >>> tuple(BertBackbone.from_preset("bert_tiny").token_embedding.embeddings.shape)
    (30522, 128)
    """

    presets = BERT_PRESETS
    preset_family = "BERT"
    token_embedding_path = "embeddings.token_embedding"  # tied to the MLM output

    def __init__(
        self,
        vocabulary_size,
        num_layers,
        num_heads,
        hidden_dim,
        intermediate_dim,
        max_sequence_length=512,
        num_segments=2,
        dropout=0.1,
        activation="gelu",
        layer_norm_epsilon=1e-12,
        fused_qkv=True,
        dtype=None,
        **kwargs,
    ):
        check_transformer_sizes(vocabulary_size, num_layers, num_heads, hidden_dim,
                                intermediate_dim)
        check_positive_int("max_sequence_length", max_sequence_length)
        check_positive_int("num_segments", num_segments)
        check_rate("dropout", dropout)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)

        # === Layers ===
        embeddings = TokenAndPositionEmbedding(
            vocabulary_size, max_sequence_length, hidden_dim, num_segments=num_segments,
            embeddings_initializer=bert_kernel_initializer(), dtype=dtype, name="embeddings",
        )
        embeddings_layer_norm = keras.layers.LayerNormalization(
            epsilon=layer_norm_epsilon, dtype=dtype, name="embeddings_layer_norm"
        )
        embeddings_dropout = keras.layers.Dropout(
            dropout, dtype=dtype, name="embeddings_dropout"
        )
        blocks = [
            TransformerEncoderBlock(
                num_heads=num_heads, intermediate_dim=intermediate_dim, dropout=dropout,
                activation=activation, layer_norm_epsilon=layer_norm_epsilon,
                fused_qkv=fused_qkv, kernel_initializer=bert_kernel_initializer(),
                dtype=dtype, name=f"transformer_layer_{i}",
            )
            for i in range(num_layers)
        ]
        pooled_dense = keras.layers.Dense(
            hidden_dim, activation="tanh", kernel_initializer=bert_kernel_initializer(),
            dtype=dtype, name="pooled_dense",
        )

        # === Functional Model ===
        token_ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
        segment_ids = keras.Input(shape=(None,), dtype="int32", name="segment_ids")
        padding_mask = keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        x = embeddings(token_ids, segment_ids=segment_ids)  # (B, T, H)
        x = embeddings_dropout(embeddings_layer_norm(x))  # (B, T, H)
        cls_state, x = encode(blocks, x, padding_mask)  # (B, H), (B, T, H)
        pooled = pooled_dense(cls_state)  # (B, H)
        super().__init__(
            inputs={
                "token_ids": token_ids,
                "segment_ids": segment_ids,
                "padding_mask": padding_mask,
            },
            outputs={"sequence_output": x, "pooled_output": pooled},
            dtype=dtype,
            **kwargs,
        )

        # === Config ===
        self.store_arguments(locals())



def bert_parameter_count(
    vocabulary_size, num_layers, hidden_dim, intermediate_dim, num_heads=None,
    max_sequence_length=512, num_segments=2,
):
    """Closed-form parameter count of a `BertBackbone` (with its pooler).

    Takes the constructor's size arguments (so `**BERT_PRESETS[name]` works); the count
    does not depend on `num_heads`.

        embeddings: (V + P + S) H + 2H           (tables + LayerNorm)
        per layer:  4 (H^2 + H) + 2 H F + F + H + 4H   (Q, K, V, O; FFN; two LayerNorms)
        pooler:     H^2 + H

    Example:
    >>> bert_parameter_count(**BERT_PRESETS["bert_base"])
    109482240
    """
    H, F = hidden_dim, intermediate_dim
    embeddings = (vocabulary_size + max_sequence_length + num_segments) * H + 2 * H
    layer = 4 * (H * H + H) + 2 * H * F + F + H + 4 * H
    return embeddings + num_layers * layer + H * H + H


def check_bert_backbone(backbone):
    """Raises unless `backbone` is a `BertBackbone` (shared by the BERT task models)."""
    if not isinstance(backbone, BertBackbone):
        raise ValueError(
            "`backbone` must be a BertBackbone (build one with BertBackbone(...), "
            "BertBackbone.from_preset(...) or keras_attn.checkpoints.load_hf_bert(...)). "
            f"Received: backbone={backbone!r}"
        )


def encode(blocks, x, padding_mask, cls_state=True, sequence_output=True):
    """BERT's encoder stack on the embedded `x` `(B, T, H)`: `(cls_state, sequence_output)`,
    the last block's [CLS] row `(B, H)` and all its rows `(B, T, H)` (`None` where not
    asked for).

    The pooler reads only the [CLS] row of the last block, so that row comes from its own
    call of the block with one query (`query_length=1`, same weights, same values). A model
    that uses only `pooled_output` (a classifier) then never computes the other `T - 1`
    rows of the last block: graph compilers (tf.function, XLA, the TFLite converter) drop
    the unused branch.

    Args:
        blocks: the encoder blocks, first to last (`TransformerEncoderBlock`s, or any
            block taking `padding_mask` and `query_length`).
        x: `(B, T, H)` embeddings. padding_mask: `(B, T)`, 1 for real tokens.
        cls_state, sequence_output: bool, which outputs to compute.
    """
    for block in blocks[:-1]:
        x = block(x, padding_mask=padding_mask)  # (B, T, H)
    cls_row = sequence = None
    if cls_state:
        cls_row = blocks[-1](x, padding_mask=padding_mask, query_length=1)[:, 0, :]  # (B, H)
    if sequence_output:
        sequence = blocks[-1](x, padding_mask=padding_mask)  # (B, T, H)
    return cls_row, sequence
