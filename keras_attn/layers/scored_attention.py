import math

import keras
from keras import ops

from keras_attn.layers.attention_mask import and_masks
from keras_attn.layers.attention_mask import merge_attention_masks
from keras_attn.layers.scaled_dot_product_attention import masked_softmax
from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rate
from keras_attn.layers.validation import clone_initializer

SCORES = ("dot", "scaled_dot", "general", "additive", "cosine", "location")

# Scores that compare s_t and h_i feature by feature, so both need the same size.
_SAME_SIZE_SCORES = ("dot", "scaled_dot", "cosine")

# Keeps cosine finite for all-zero vectors (padding): their score is 0, then masked.
_COSINE_EPSILON = 1e-12


@keras.saving.register_keras_serializable(package="keras_attn")
class ScoredAttention(keras.layers.Layer):
    """Single-head attention with a choice of the classic alignment scores.

    A target state `s_t` (decoder state, or a token in self-attention) attends over source
    states `h_i` (encoder states):

        alpha_t = softmax_i(score(s_t, h_i)),    c_t = sum_i alpha_ti v_i

    with, for `score=`:

        "dot"          s_t^T h_i                            (Luong et al., 2015)
        "scaled_dot"   s_t^T h_i / sqrt(n),  n = dim(h_i)   (Vaswani et al., 2017)
        "general"      s_t^T W_a h_i                        (Luong et al., 2015)
        "additive"     v_a^T tanh(W_a [s_t; h_i])           (Bahdanau et al., 2015)
        "cosine"       cosine(s_t, h_i)                     (Graves et al., 2014)
        "location"     alpha_t = softmax(W_a s_t)           (Luong et al., 2015)

    `h_i` is the key (by default the value itself, as in RNN encoder-decoders). The
    additive score is computed as `W_s s_t + W_h h_i` broadcast over `(t, i)`, which is
    the same as `W_a [s_t; h_i]` with `W_a = [W_s W_h]` but never builds the `T * S`
    concatenations. The location score ignores the source contents: `W_a` maps `s_t` to
    `max_source_length` scores and the first `S` are used.

    Weights (named after the formulas): `kernel` is `W_a`, of shape `(d_q, d_k)` for
    "general", `(d_q + d_k, units)` for "additive" (rows `[:d_q]` act on `s_t`) and
    `(d_q, max_source_length)` for "location"; `score_vector` is the additive `v_a`,
    `(units,)`. "dot", "scaled_dot" and "cosine" have no weights.

    Args:
        score: str, one of `"dot"`, `"scaled_dot"`, `"general"`, `"additive"`,
            `"cosine"`, `"location"`. Defaults to `"scaled_dot"`.
        units: int, hidden size of the additive score (rows of `W_a`). Defaults to the
            key feature size. Only for `score="additive"`.
        max_source_length: int, the largest source length `S` the location score
            handles. Required for, and only for, `score="location"`.
        dropout: float, dropout rate on the attention weights. Defaults to `0.0`.
        kernel_initializer: initializer for `W_a` and `v_a`.
        seed: optional int seed for the dropout.

    Call arguments:
        query: `(B, T, d_q)`, the states `s_t` that attend.
        value: `(B, S, d_v)`, the states `v_i` that are averaged.
        key: optional `(B, S, d_k)`, the states `h_i` that are scored. Defaults to
            `value`.
        padding_mask: optional `(B, S)`, True/1 for real source positions. Keras
            implicit masks on `query`, `value` and `key` (`Embedding(mask_zero=True)`,
            `Masking`) are used too; a padded query gets a zero context.
        attention_mask: optional boolean `(B, T, S)` (or `(T, S)`); True where `s_t` may
            look at `h_i`.
        return_attention_scores: bool, also return the weights `alpha`.
        training: bool, enables dropout.

    Returns:
        `(B, T, d_v)` context vectors, or `(context, alpha)` with `alpha` `(B, T, S)`
        when `return_attention_scores=True`. The output keeps the query's Keras mask.

    Example:
    >>> decoder_states = keras.ops.ones((2, 3, 8))
    >>> encoder_states = keras.ops.ones((2, 5, 6))
    >>> attention = ScoredAttention(score="additive", units=16)
    >>> tuple(attention(decoder_states, encoder_states).shape)
    (2, 3, 6)
    """

    def __init__(
        self,
        score="scaled_dot",
        units=None,
        max_source_length=None,
        dropout=0.0,
        kernel_initializer="glorot_uniform",
        seed=None,
        **kwargs,
    ):
        if score not in SCORES:
            raise ValueError(
                f"`score` must be one of {', '.join(repr(s) for s in SCORES)}. "
                f"Received: score={score!r}"
            )
        if units is not None:
            check_positive_int("units", units)
            if score != "additive":
                raise ValueError(
                    "`units` is the hidden size of the additive score and is only used "
                    f"with score='additive'. Received: units={units}, score={score!r}"
                )
        if max_source_length is not None:
            check_positive_int("max_source_length", max_source_length)
            if score != "location":
                raise ValueError(
                    "`max_source_length` is only used with score='location'. "
                    f"Received: max_source_length={max_source_length}, score={score!r}"
                )
        elif score == "location":
            raise ValueError(
                "score='location' maps each query to one score per source position, so it "
                "needs `max_source_length`, the largest source length it will see. "
                "Received: max_source_length=None"
            )
        check_rate("dropout", dropout)
        super().__init__(**kwargs)
        self.score = score
        self.units = units
        self.max_source_length = max_source_length
        self.dropout = dropout
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = seed
        self.supports_masking = True

    # === Build ===

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        query_dim, key_dim = query_shape[-1], key_shape[-1]
        if self.score in _SAME_SIZE_SCORES and query_dim != key_dim:
            raise ValueError(
                f"score={self.score!r} compares s_t and h_i feature by feature, so query "
                "and key (the value, when no key is given) need the same last dimension; "
                "use score='general' or 'additive' for different sizes. "
                f"Received: query_shape={tuple(query_shape)}, key_shape={tuple(key_shape)}"
            )
        if self.score == "location":
            self._check_source_length(value_shape[1])
        if self.score == "general":
            self.kernel = self._add_kernel("kernel", (query_dim, key_dim))
        elif self.score == "additive":
            units = self.units or key_dim
            self.kernel = self._add_kernel("kernel", (query_dim + key_dim, units))
            self.score_vector = self._add_kernel("score_vector", (units,))
        elif self.score == "location":
            self.kernel = self._add_kernel("kernel", (query_dim, self.max_source_length))
        self.dropout_layer = keras.layers.Dropout(
            self.dropout, seed=self.seed, dtype=self.dtype_policy
        )
        self.built = True

    def _add_kernel(self, name, shape):
        return self.add_weight(
            name=name, shape=shape, initializer=clone_initializer(self.kernel_initializer)
        )

    # === Call ===

    def call(
        self,
        query,
        value,
        key=None,
        query_mask=None,
        value_mask=None,
        key_mask=None,
        padding_mask=None,
        attention_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        key = value if key is None else key
        scores = self._scores(query, key)  # (B, T, S)
        mask = merge_attention_masks(
            ops.shape(query)[1], ops.shape(value)[1],
            query_mask=query_mask, key_mask=and_masks(padding_mask, value_mask, key_mask),
            attention_mask=attention_mask,
        )  # (B, T, S) or None
        weights = masked_softmax(scores, mask)  # (B, T, S)
        dropped = self.dropout_layer(weights, training=training)  # (B, T, S)
        context = ops.einsum("bts,bsd->btd", dropped, value)  # (B, T, d_v)
        if return_attention_scores:
            return context, weights
        return context

    def _scores(self, query, key):
        """Alignment scores `score(s_t, h_i)` for every pair, `(B, T, S)`."""
        if self.score == "dot":
            return ops.einsum("btd,bsd->bts", query, key)  # (B, T, S)
        if self.score == "scaled_dot":
            # Scaling the query before the matmul keeps half-precision scores in range.
            scale = ops.cast(1.0 / math.sqrt(key.shape[-1]), query.dtype)
            return ops.einsum("btd,bsd->bts", query * scale, key)  # (B, T, S)
        if self.score == "general":
            kernel = ops.cast(self.kernel, self.compute_dtype)  # (d_q, d_k)
            projected = ops.einsum("btq,qk->btk", query, kernel)  # (B, T, d_k)
            return ops.einsum("btk,bsk->bts", projected, key)  # (B, T, S)
        if self.score == "additive":
            kernel = ops.cast(self.kernel, self.compute_dtype)  # (d_q + d_k, U)
            vector = ops.cast(self.score_vector, self.compute_dtype)  # (U,)
            query_dim = query.shape[-1]
            from_query = ops.einsum("btq,qu->btu", query, kernel[:query_dim])  # (B, T, U)
            from_key = ops.einsum("bsk,ku->bsu", key, kernel[query_dim:])  # (B, S, U)
            hidden = ops.tanh(from_query[:, :, None, :] + from_key[:, None, :, :])  # (B, T, S, U)
            return ops.einsum("btsu,u->bts", hidden, vector)  # (B, T, S)
        if self.score == "cosine":
            # Norms in float32: squares of float16 features overflow past ~256.
            q = ops.cast(query, "float32")
            k = ops.cast(key, "float32")
            q = q / ops.maximum(ops.norm(q, axis=-1, keepdims=True), _COSINE_EPSILON)
            k = k / ops.maximum(ops.norm(k, axis=-1, keepdims=True), _COSINE_EPSILON)
            cosine = ops.einsum("btd,bsd->bts", q, k)  # (B, T, S)
            return ops.cast(cosine, self.compute_dtype)
        # "location": scores for positions 0 .. max_source_length - 1, keep the first S.
        self._check_source_length(key.shape[1])
        kernel = ops.cast(self.kernel, self.compute_dtype)  # (d_q, S_max)
        scores = ops.einsum("btq,qm->btm", query, kernel)  # (B, T, S_max)
        return scores[:, :, : ops.shape(key)[1]]  # (B, T, S)

    def _check_source_length(self, source_length):
        if source_length is not None and source_length > self.max_source_length:
            raise ValueError(
                "score='location' has one weight column per source position, up to "
                f"`max_source_length`={self.max_source_length}; the source is longer. "
                f"Received: source length={source_length}"
            )

    def compute_mask(self, query, previous_mask=None):
        # Keras calls this with the first input and its mask: the output is per query.
        return previous_mask

    def get_config(self):
        config = super().get_config()
        config.update(
            score=self.score,
            units=self.units,
            max_source_length=self.max_source_length,
            dropout=self.dropout,
            kernel_initializer=keras.initializers.serialize(self.kernel_initializer),
            seed=self.seed,
        )
        return config

