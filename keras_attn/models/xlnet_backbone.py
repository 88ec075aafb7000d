import keras
from keras import ops

from keras_attn.layers.validation import check_bool
from keras_attn.layers.validation import check_number_above
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.layers.xlnet_block import XLNetBlock
from keras_attn.models.backbone import Backbone
from keras_attn.models.model_arguments import check_transformer_sizes

# Sizes of Yang et al. (2019): XLNet-Base (the `xlnet-base-cased` checkpoint, 116.7M
# parameters with its 32,000-piece SentencePiece vocabulary) and XLNet-Large, plus a
# tiny configuration for tests and toy runs.
XLNET_PRESETS = {
    "xlnet_tiny": dict(
        vocabulary_size=1000, num_layers=2, num_heads=2, hidden_dim=32,
        intermediate_dim=64, dropout=0.0,
    ),
    "xlnet_base_cased": dict(
        vocabulary_size=32000, num_layers=12, num_heads=12, hidden_dim=768,
        intermediate_dim=3072, dropout=0.1,
    ),
    "xlnet_large_cased": dict(
        vocabulary_size=32000, num_layers=24, num_heads=16, hidden_dim=1024,
        intermediate_dim=4096, dropout=0.1,
    ),
}


def xlnet_parameter_count(vocabulary_size, num_layers, num_heads, hidden_dim,
                          intermediate_dim, **unused):
    """Number of weights of an `XLNetBackbone` (= transformers' `XLNetModel`).

        V d + d                               (embedding, query-stream start w)
        + L (5 d^2 + 5 d                       (q, k, v, o, W_{k,R}; u, v, b, s+/s-)
             + 2 d d_ff + d_ff + d + 4 d)      (FFN, two LayerNorms)

    Example:
    >>> xlnet_parameter_count(**XLNET_PRESETS["xlnet_base_cased"])
    116718336
    """
    d, f = hidden_dim, intermediate_dim
    per_layer = 5 * d * d + 5 * d + 2 * d * f + f + d + 4 * d
    return vocabulary_size * d + d + num_layers * per_layer


@keras.saving.register_keras_serializable(package="keras_attn")
class XLNetBackbone(Backbone):
    """XLNet encoder (Yang et al., 2019, "XLNet: Generalized Autoregressive Pretraining
    for Language Understanding").

        h^0 = Dropout(W_emb[x])                     content stream  (B, T, d)
        g^0 = Dropout(w)                            query stream    (B, P, d), w learned
        h^n, g^n = XLNetBlock_n(h^{n-1}, g^{n-1}, memory=m^{n-1})    n = 1 .. L
        m'^{n-1} = SG([m^{n-1} ∘ h^{n-1}])[-memory_length:]

    No absolute positions: each block's attention uses relative sinusoids and relative
    segment encodings. The query stream exists only with `two_stream=True`
    (pretraining); fine-tuning uses the content stream alone.

    Args:
        vocabulary_size, num_layers, num_heads, hidden_dim, intermediate_dim: sizes
            (`hidden_dim` even and divisible by `num_heads`).
        dropout: float. Defaults to `0.1`.
        activation: feed-forward activation. Defaults to `"gelu"`.
        layer_norm_epsilon: float. Defaults to `1e-12`.
        two_stream: bool, add the query stream, its inputs `permutation_mask` and
            `target_mapping` and its output `query_output`. Defaults to `False`.
        memory_length: int or `None`. With an int, the model takes `memory`
            `(B, L, M, d)` (any `M >= 0`) and returns the next one, the newest
            `memory_length` states of `[memory; h]` per layer. Defaults to `None`.
        dtype: dtype policy. **kwargs: `keras.Model` arguments.

    Inputs:
        A dict: `token_ids`, `segment_ids`, `padding_mask` `(B, T)` ints (1 = real token);
        with `two_stream`: `permutation_mask` `(B, T, T)` int, 1 where position `i` may
        see `j` in the factorization order (`z_j` before `z_i`), and `target_mapping`
        `(B, P, T)` float one-hot rows; with `memory_length`: `memory`.

    Returns:
        A dict: `sequence_output` `(B, T, d)` (content stream); `query_output`
        `(B, P, d)` with `two_stream`; `memory` `(B, L, M', d)` with `memory_length`.

    Example:
    >>> backbone = XLNetBackbone.from_preset("xlnet_tiny", vocabulary_size=50)
    >>> out = backbone({"token_ids": np.array([[5, 6, 7]]), "segment_ids": np.zeros((1, 3)),
    ...                 "padding_mask": np.ones((1, 3))})
    >>> tuple(out["sequence_output"].shape)
    (1, 3, 32)
    """

    presets = XLNET_PRESETS
    preset_family = "XLNet"
    transformer_layer_prefixes = ("xlnet_layer_",)

    def __init__(self, vocabulary_size, num_layers, num_heads, hidden_dim,
                 intermediate_dim, dropout=0.1, activation="gelu",
                 layer_norm_epsilon=1e-12, two_stream=False, memory_length=None,
                 dtype=None, **kwargs):
        check_transformer_sizes(vocabulary_size, num_layers, num_heads, hidden_dim,
                                intermediate_dim, sinusoids="the relative sinusoids")
        check_rate("dropout", dropout)
        check_number_above("layer_norm_epsilon", layer_norm_epsilon, 0)
        check_bool("two_stream", two_stream)
        if memory_length is not None:
            check_positive_int("memory_length", memory_length)

        # === Layers ===
        initializer = keras.initializers.RandomNormal(stddev=0.02)
        token_embedding = keras.layers.ReversibleEmbedding(
            vocabulary_size, hidden_dim, embeddings_initializer=initializer,
            dtype=dtype, name="token_embedding")
        embedding_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="embedding_dropout")
        blocks = [
            XLNetBlock(num_heads=num_heads, intermediate_dim=intermediate_dim,
                       dropout=dropout, activation=activation,
                       layer_norm_epsilon=layer_norm_epsilon, dtype=dtype,
                       name=f"xlnet_layer_{i}")
            for i in range(num_layers)
        ]
        output_dropout = keras.layers.Dropout(dropout, dtype=dtype, name="output_dropout")

        # === Functional Model ===
        inputs = {
            "token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
            "segment_ids": keras.Input((None,), dtype="int32", name="segment_ids"),
            "padding_mask": keras.Input((None,), dtype="int32", name="padding_mask"),
        }
        visible = ops.expand_dims(ops.cast(inputs["padding_mask"], "bool"), 1)  # (B, 1, T)
        query_stream = target_mapping = None
        if two_stream:
            inputs["permutation_mask"] = keras.Input(
                (None, None), dtype="int32", name="permutation_mask")
            inputs["target_mapping"] = keras.Input((None, None), name="target_mapping")
            target_mapping = inputs["target_mapping"]
            visible = ops.logical_and(
                visible, ops.cast(inputs["permutation_mask"], "bool"))  # (B, T, T)
            start = _QueryStreamStart(hidden_dim, dtype=dtype, name="query_stream_start")
            query_stream = embedding_dropout(start(target_mapping))  # (B, P, d)
        else:
            every_query = ops.expand_dims(ops.cast(ops.ones_like(inputs["token_ids"]), "bool"), -1)
            visible = ops.logical_and(every_query, visible)  # (B, T, T)
        if memory_length is not None:
            inputs["memory"] = keras.Input((num_layers, None, hidden_dim), name="memory")
        h = embedding_dropout(token_embedding(inputs["token_ids"]))  # (B, T, d)
        memories = []
        for i, block in enumerate(blocks):
            memory = None
            if memory_length is not None:
                memory = inputs["memory"][:, i]  # (B, M, d)
                history = ops.concatenate([memory, h], axis=1)  # (B, M + T, d)
                memories.append(ops.stop_gradient(history[:, -memory_length:]))
            out = block(h, query_stream=query_stream, memory=memory,
                        attention_mask=visible, segment_ids=inputs["segment_ids"],
                        target_mapping=target_mapping)
            h, query_stream = out if two_stream else (out, None)
        outputs = {"sequence_output": output_dropout(h)}
        if two_stream:
            outputs["query_output"] = output_dropout(query_stream)
        if memory_length is not None:
            outputs["memory"] = ops.stack(memories, axis=1)  # (B, L, M', d)
        super().__init__(inputs=inputs, outputs=outputs, dtype=dtype, **kwargs)

        # === Config ===
        self.store_arguments(locals())

    def content_stream_backbone(self):
        """A copy without query stream and memory, with this backbone's weights (what
        fine-tuning heads take after permutation-LM pretraining).

        Example:
        >>> pretrained = XLNetBackbone.from_preset("xlnet_tiny", two_stream=True)
        >>> pretrained.content_stream_backbone().two_stream
        False
        """
        config = {**self.get_config(), "two_stream": False, "memory_length": None}
        config.pop("name")
        copy = type(self).from_config(config)
        for layer in copy.layers:
            if layer.weights:
                layer.set_weights(self.get_layer(layer.name).get_weights())
        return copy


class _QueryStreamStart(keras.layers.Layer):
    """The query stream's first state `g^0 = w`, one learned `(d,)` vector (`mask_emb`).

    Part of `XLNetBackbone`'s graph, which its `__init__` rebuilds: not registered.

    Call arguments:
        target_mapping: `(B, P, T)`; only its batch and `P` are used.

    Returns:
        `(B, P, d)`, `w` repeated.
    """

    def __init__(self, hidden_dim, **kwargs):
        super().__init__(**kwargs)
        self.hidden_dim = hidden_dim

    def build(self, target_mapping_shape):
        self.start = self.add_weight(
            name="start", shape=(self.hidden_dim,),
            initializer=keras.initializers.RandomNormal(stddev=0.02))

    def call(self, target_mapping):
        batch, predictions = ops.shape(target_mapping)[0], ops.shape(target_mapping)[1]
        start = ops.cast(self.start, self.compute_dtype)
        return ops.broadcast_to(start, (batch, predictions, self.hidden_dim))

    def get_config(self):
        return {**super().get_config(), "hidden_dim": self.hidden_dim}
