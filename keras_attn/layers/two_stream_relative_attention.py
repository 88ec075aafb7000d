import math

import keras
from keras import ops

from keras_attn.layers.relative_multi_head_attention import RelativeMultiHeadAttention


@keras.saving.register_keras_serializable(package="keras_attn")
class TwoStreamRelativeAttention(RelativeMultiHeadAttention):
    """XLNet two-stream relative attention (Yang et al., 2019, §2.3, §2.5).

    Two streams of queries read the same keys and values `[SG(memory); h]`, with one
    set of weights. For a factorization order `z` (given as a visibility mask):

        h_{z_t} <- Attention(Q = h_{z_t}, KV = [m; h_{z<=t}])   content stream: sees x_{z_t}
        g_{z_t} <- Attention(Q = g_{z_t}, KV = [m; h_{z<t}])    query stream: knows z_t only

    Scores are Transformer-XL's terms (a)-(d) (`RelativeMultiHeadAttention`) plus
    XLNet's relative segment term (e):

        A_ij = ( (q_i + u)^T k_j + (q_i + v)^T W_{k,R} R_{i-j} + (q_i + b)^T s_ij ) / sqrt(d_k)

    with `s_ij = s+` when tokens `i` and `j` have the same segment id and `s-`
    otherwise (`segment_embedding[0]`, `segment_embedding[1]`, per head) and `b` the
    `segment_bias`. The memory is given segment id 0, as in the official code and
    transformers. Without `segment_ids` the term is left out.

    Args:
        num_heads: int, number of heads `H`.
        key_dim: int, size of each head `d_k`.
        **kwargs: the arguments of `RelativeMultiHeadAttention`. XLNet's projections
            have no biases: pass `use_bias=False`.

    Call arguments:
        inputs: `(B, T, d)`, the content stream `h`.
        query_stream: optional `(B, T, d)` query stream `g`, or `(B, P, d)` with
            `target_mapping`. Without it only the content stream is computed
            (fine-tuning).
        memory: optional `(B, M, d)` states of previous segments, no gradient.
        attention_mask: optional boolean `(B, T, T)` or `(B, T, M + T)`; True where
            query `i` may see key `j` in the query stream (the memory is always visible
            with a `(B, T, T)` mask). The content stream also sees its own position.
            `None`: every key visible.
        segment_ids: optional int `(B, T)`.
        target_mapping: optional `(B, P, T)` one-hot rows: query-stream row `p` predicts
            position `argmax_t target_mapping[p, t]`.
        training: bool, enables dropout.

    Returns:
        The content attention output `(B, T, d)`, and with `query_stream` a tuple
        `(content, query)` with query `(B, T or P, d)`.

    Example:
    >>> layer = TwoStreamRelativeAttention(num_heads=2, key_dim=4, use_bias=False)
    >>> h, g = keras.ops.ones((1, 3, 8)), keras.ops.zeros((1, 3, 8))
    >>> content, query = layer(h, query_stream=g, segment_ids=keras.ops.zeros((1, 3)))
    >>> tuple(content.shape), tuple(query.shape)
    ((1, 3, 8), (1, 3, 8))
    """

    def build(self, query_shape):
        super().build(query_shape)
        kwargs = self._dense_kwargs()
        self.segment_bias = self.add_weight(
            name="segment_bias", shape=(self.num_heads, self.key_dim),
            initializer=kwargs["bias_initializer"],
        )
        self.segment_embedding = self.add_weight(
            name="segment_embedding", shape=(2, self.num_heads, self.key_dim),
            initializer=kwargs["kernel_initializer"],
        )

    def call(self, inputs, query_stream=None, memory=None, attention_mask=None,
             segment_ids=None, target_mapping=None, training=None):
        keys = inputs  # (B, T, d)
        if memory is not None:
            if len(memory.shape) != 3 or memory.shape[-1] != inputs.shape[-1]:
                raise ValueError(
                    "`memory` must be (batch, memory_length, d_model) with the content "
                    f"stream's d_model={inputs.shape[-1]}. Received: "
                    f"memory.shape={tuple(memory.shape)}"
                )
            memory = ops.stop_gradient(ops.cast(memory, inputs.dtype))  # (B, M, d)
            keys = ops.concatenate([memory, inputs], axis=1)  # (B, S, d)
        k = self.key_dense(keys)  # (B, S, H, dk)
        v = self.value_dense(keys)  # (B, S, H, dv)
        query_mask, content_mask = stream_masks(attention_mask, inputs, keys)  # (B, T, S)
        different = different_segments(segment_ids, inputs, keys)  # (B, T, S) or None

        # === Content stream: Q = h, sees itself ===
        content = self._attend(self.query_dense(inputs), k, v, content_mask, different,
                               training)  # (B, T, H, dv)
        content = self.output_dense(content)  # (B, T, d)
        if query_stream is None:
            return content

        # === Query stream: Q = g, never its own content ===
        q = self.query_dense(query_stream)  # (B, P, H, dk)
        if target_mapping is not None:
            mapping = ops.cast(target_mapping, q.dtype)  # (B, P, T)
            q = ops.einsum("bphd,bpt->bthd", q, mapping)  # (B, T, H, dk)
        query = self._attend(q, k, v, query_mask, different, training)  # (B, T, H, dv)
        if target_mapping is not None:
            query = ops.einsum("bthd,bpt->bphd", query, mapping)  # (B, P, H, dv)
        return content, self.output_dense(query)  # (B, T, d), (B, P, d)

    def _attend(self, q, k, v, mask, different, training):
        """Terms (a)-(d) of the parent plus the segment term (e) as its bias."""
        bias = None
        if different is not None:
            u = ops.cast(self.segment_bias, q.dtype)  # (H, dk)
            s = ops.cast(self.segment_embedding, q.dtype)  # (2, H, dk)
            scores = ops.einsum("bthd,shd->bhts", q + u, s)  # (B, H, T, 2)
            bias = ops.where(
                ops.expand_dims(different, 1), scores[..., 1:], scores[..., :1]
            )  # (B, H, T, S)
            bias = bias * ops.cast(1.0 / math.sqrt(self.key_dim), bias.dtype)
        output, _ = self._compute_attention(
            q, k, v, attention_mask=mask, attention_bias=bias, training=training
        )
        return output  # (B, T, H, dv)

    def compute_output_spec(self, inputs, query_stream=None, **kwargs):
        d_out = self.output_dim or inputs.shape[-1]
        content = keras.KerasTensor(tuple(inputs.shape[:-1]) + (d_out,), self.compute_dtype)
        if query_stream is None:
            return content
        query = keras.KerasTensor(
            tuple(query_stream.shape[:-1]) + (d_out,), self.compute_dtype)
        return content, query


def stream_masks(attention_mask, inputs, keys):
    """The `(B, T, S)` masks of the query stream and the content stream (or `None`s).

    The content mask is the query mask plus each position's own key (at `M + i`).
    """
    if attention_mask is None:
        return None, None
    mask = ops.cast(attention_mask, "bool")
    if len(mask.shape) != 3:
        raise ValueError(
            "`attention_mask` must be (batch, segment_length, segment_length) or (batch, "
            "segment_length, memory_length + segment_length). Received: "
            f"attention_mask.shape={tuple(mask.shape)}"
        )
    batch, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
    missing = ops.shape(keys)[1] - ops.shape(mask)[2]  # M for a (B, T, T) mask, else 0
    memory_mask = ops.ones((batch, length, missing), dtype="bool")
    query_mask = ops.concatenate([memory_mask, mask], axis=2)  # (B, T, S)
    offset = ops.shape(keys)[1] - length  # M
    diagonal = ops.equal(ops.expand_dims(ops.arange(ops.shape(keys)[1]), 0),
                         ops.expand_dims(ops.arange(length), 1) + offset)  # (T, S): key M + i
    content_mask = ops.logical_or(query_mask, diagonal[None])  # (B, T, S)
    return query_mask, content_mask


def different_segments(segment_ids, inputs, keys):
    """`(B, T, S)` True where query `i` and key `j` are in different segments."""
    if segment_ids is None:
        return None
    segment_ids = ops.cast(segment_ids, "int32")  # (B, T)
    missing = ops.shape(keys)[1] - ops.shape(inputs)[1]
    memory_ids = ops.zeros((ops.shape(segment_ids)[0], missing), dtype="int32")
    key_ids = ops.concatenate([memory_ids, segment_ids], axis=1)  # (B, S)
    return ops.not_equal(ops.expand_dims(segment_ids, 2), ops.expand_dims(key_ids, 1))  # (B, T, S)
