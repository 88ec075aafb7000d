import math

import keras
from keras import ops

from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.scaled_dot_product_attention import masked_softmax
from keras_attn.layers.validation import check_positive_int


def clipped_relative_positions(
    query_length, key_length, max_relative_position, query_start_index=None
):
    """Row indices into Shaw et al.'s relative tables: `clip(j - pos(i), -k, k) + k`.

    Query `i` sits at absolute position `pos(i) = query_start_index + i` among the keys;
    `None` aligns the queries with the end of the keys (`S - T`), as for self-attention
    and for a key/value cache filled up to the current step.

    Args:
        query_length: int or scalar tensor, T.
        key_length: int or scalar tensor, S.
        max_relative_position: int `k`; distances beyond `k` share the edge rows.
        query_start_index: optional int or scalar tensor, absolute position of query 0.

    Returns:
        int32 `(T, S)` tensor with values in `[0, 2k]`.

    Example:
    >>> ops.convert_to_numpy(clipped_relative_positions(3, 3, 1))
    array([[1, 2, 2],
           [0, 1, 2],
           [0, 0, 1]], dtype=int32)
    """
    if query_start_index is None:
        query_start_index = key_length - query_length
    start = ops.cast(query_start_index, "int32")
    row = ops.arange(query_length, dtype="int32")[:, None] + start  # (T, 1)
    col = ops.arange(key_length, dtype="int32")[None, :]  # (1, S)
    distance = ops.clip(col - row, -max_relative_position, max_relative_position)  # (T, S)
    return distance + max_relative_position


@keras.saving.register_keras_serializable(package="keras_attn")
class ShawRelativeAttention(MultiHeadAttention):
    """Multi-head attention with learned relative position representations.

    Shaw, Uszkoreit & Vaswani (2018), "Self-Attention with Relative Position
    Representations", §3. The edge from query `i` to key `j` carries two learned
    vectors that depend only on the clipped distance `j - i`:

        a^K_ij = w^K_{clip(j - i, k)},    a^V_ij = w^V_{clip(j - i, k)}
        e_ij = q_i (k_j + a^K_ij)^T / sqrt(d_k)
        alpha_ij = softmax_j(e_ij)
        z_i = sum_j alpha_ij (v_j + a^V_ij)

    where `q`, `k`, `v` are the per-head projections of `MultiHeadAttention` and
    `clip(x, k) = max(-k, min(k, x))`: beyond `k` positions every distance looks the
    same, which is what lets the model generalise to longer sequences. The tables are
    shared across heads (as in the paper), `relative_key_embeddings` `(2k + 1, d_k)` and
    `relative_value_embeddings` `(2k + 1, d_v)`, row `k + r` for distance `r`.

    Everything else (projections, masks, dropout, the key/value cache) is
    `MultiHeadAttention`'s; this class only overrides the `_compute_attention` hook. Query
    `i` sits at position `query_start_index + i` among the keys (the cache index while
    decoding; by default the end of the keys), so cached decoding gives the same outputs
    as a full causal pass.

    Args:
        num_heads: int, number of heads `H`.
        key_dim: int, size of each query/key head `d_k`.
        max_relative_position: int `k >= 1`, the clipping distance (the paper uses
            `k = 16`, and finds little gain beyond `k = 2` for translation).
        **kwargs: the other arguments of `MultiHeadAttention` (`value_dim`, `dropout`,
            `use_bias`, `output_dim`, `fused_qkv`, `sliding_window`,
            `kernel_initializer`, `bias_initializer`, `seed`, ...) and of
            `keras.layers.Layer`. The relative tables use `kernel_initializer`.

    Call arguments:
        Those of `MultiHeadAttention`: `query`, `value`, `key`, `padding_mask`,
        `attention_mask`, `attention_bias`, `use_causal_mask`, `cache`,
        `cache_update_index`, `return_attention_scores`, `training`.

    Returns:
        `(B, T, d_out)`, or a tuple as for `MultiHeadAttention` (with attention scores
        `(B, H, T, S)` and/or the updated cache).

    Example:
    >>> attention = ShawRelativeAttention(num_heads=2, key_dim=4, max_relative_position=2)
    >>> x = keras.ops.ones((1, 5, 8))
    >>> tuple(attention(x, use_causal_mask=True).shape)
    (1, 5, 8)
    """

    def __init__(self, num_heads, key_dim, max_relative_position, **kwargs):
        check_positive_int(
            "max_relative_position", max_relative_position,
            "the clipping distance k of the relative position tables",
        )
        super().__init__(num_heads=num_heads, key_dim=key_dim, **kwargs)
        self.max_relative_position = max_relative_position

    # === Build ===

    def build(self, query_shape, value_shape=None, key_shape=None):
        super().build(query_shape, value_shape=value_shape, key_shape=key_shape)
        num_rows = 2 * self.max_relative_position + 1
        self.relative_key_embeddings = self.add_weight(
            name="relative_key_embeddings", shape=(num_rows, self.key_dim),
            initializer=self._dense_kwargs()["kernel_initializer"],
        )
        self.relative_value_embeddings = self.add_weight(
            name="relative_value_embeddings", shape=(num_rows, self.value_dim),
            initializer=self._dense_kwargs()["kernel_initializer"],
        )

    # === Call ===

    def _compute_attention(
        self, query, key, value, attention_mask=None, training=None,
        return_attention_scores=False, use_causal_mask=False, attention_bias=None,
        query_start_index=None,
    ):
        """Shaw et al.'s scores and outputs on projected `(B, T, H, d)` tensors."""
        attention_mask = self._add_causal_mask(
            query, key, attention_mask, use_causal_mask, query_start_index
        )  # (B, T, S) or (B, H, T, S)
        relative_keys, relative_values = self.relative_embeddings(
            ops.shape(query)[1], ops.shape(key)[1], query_start_index
        )  # (T, S, dk), (T, S, dv)

        # e_ij = q_i k_j^T + q_i a^K_ij^T, scaled; scaling q first keeps half precision in range.
        query = query * ops.cast(1.0 / math.sqrt(self.key_dim), query.dtype)  # (B, T, H, dk)
        scores = ops.einsum("bthd,bshd->bhts", query, key)  # (B, H, T, S)
        scores = scores + ops.einsum("bthd,tsd->bhts", query, relative_keys)  # (B, H, T, S)
        if attention_bias is not None:
            scores = scores + ops.cast(attention_bias, scores.dtype)
        if attention_mask is not None and len(attention_mask.shape) == 3:
            attention_mask = ops.expand_dims(attention_mask, 1)  # (B, 1, T, S)
        probs = masked_softmax(scores, attention_mask)  # (B, H, T, S)
        dropped = self.dropout_layer(probs, training=training)  # (B, H, T, S)

        # z_i = sum_j alpha_ij v_j + sum_j alpha_ij a^V_ij.
        output = ops.einsum("bhts,bshd->bthd", dropped, value)  # (B, T, H, dv)
        output = output + ops.einsum("bhts,tsd->bthd", dropped, relative_values)
        return output, probs

    def relative_embeddings(self, query_length, key_length, query_start_index=None):
        """The tables `a^K` `(T, S, d_k)` and `a^V` `(T, S, d_v)` for these lengths.

        Row `(i, j)` is `w_{clip(j - pos(i), k)}` with `pos(i) = query_start_index + i`
        (`None`: queries aligned with the end of the keys). In the compute dtype.
        """
        indices = clipped_relative_positions(
            query_length, key_length, self.max_relative_position, query_start_index
        )  # (T, S)
        key_table = ops.cast(self.relative_key_embeddings, self.compute_dtype)  # (2k+1, dk)
        value_table = ops.cast(self.relative_value_embeddings, self.compute_dtype)
        return ops.take(key_table, indices, axis=0), ops.take(value_table, indices, axis=0)

    def get_config(self):
        config = super().get_config()
        config.update(max_relative_position=self.max_relative_position)
        return config
