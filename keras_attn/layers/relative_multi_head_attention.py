import math

import keras
from keras import ops

from keras_attn.layers.attention_mask import and_masks
from keras_attn.layers.multi_head_attention import MultiHeadAttention
from keras_attn.layers.scaled_dot_product_attention import scaled_dot_product_attention

# Arguments of `MultiHeadAttention` that Transformer-XL attention does not combine with.
_UNSUPPORTED = {
    "fused_qkv": "the position term needs the separate key projection W_{k,E}",
    "rotary_max_wavelength": "positions are already encoded by the R_{i-j} terms",
}


def relative_shift(x, key_length=None):
    """Turns scores against relative positions into scores against keys (pad-and-reshape).

    Transformer-XL (Dai et al., 2019, Appendix B) computes the position scores
    `q_i . W_{k,R} R_r` once for every query `i` and every *relative distance* `r`, as
    one matmul giving `x[..., i, c]`, where column `c` stands for the distance
    `r = S - 1 - c` (distances listed from the largest, `S - 1`, downwards; `S` is the
    number of keys). Attention needs them per *key*: key `j` is at distance
    `(S - T) + i - j` from query `i` (queries aligned with the end of the keys, as with
    `[memory; segment]`), so `c = T - 1 - i + j`:

        out[..., i, j] = x[..., i, j + T - 1 - i]

    which shifts row `i` left by `T - 1 - i`. Instead of a gather, pad one zero column in
    front, reinterpret the `(T, R + 1)` block as `(R + 1, T)`, drop its first row and
    reinterpret the rest as `(T, R)`; then keep the first `S` columns. For T = 3, R = 4
    (`ic` stands for x[i, c]):

        x (T, R)       pad: (T, R+1)    view (R+1, T)   drop row 0, view (T, R)
        00 01 02 03    0 00 01 02 03    0  00 01        02 03 0  10
        10 11 12 13    0 10 11 12 13    02 03 0         11 12 13 0
        20 21 22 23    0 20 21 22 23    10 11 12        20 21 22 23
                                        13 0  20
                                        21 22 23

    Row 2 (the last query) is unshifted, row 1 shifted left by one, row 0 by two: one
    pad and two reshapes instead of a `(T, S)` gather. Two layouts are exact:

    - causal (Transformer-XL): `R = S`, distances `S - 1 .. 0`. Entries with `j > i +
      S - T` (future keys) would need a negative distance and hold leftovers from the
      next row; they must be masked, as the causal mask does.
    - bidirectional (XLNet): `R = S + T - 1`, distances `S - 1 .. -(T - 1)`, and
      `key_length=S`. Every entry is exact.

    Args:
        x: `(..., T, R)` tensor; column `c` holds relative distance `S - 1 - c`.
        key_length: int `S`, number of keys. Defaults to `R` (the causal layout).

    Returns:
        `(..., T, S)` tensor with `out[..., i, j] = x[..., i, j + T - 1 - i]`.

    Example:
    >>> x = keras.ops.convert_to_tensor([[10., 11., 12.], [20., 21., 22.]])
    >>> keras.ops.convert_to_numpy(relative_shift(x, key_length=2))  # R = S + T - 1
    array([[11., 12.],
           [20., 21.]], dtype=float32)
    """
    shape = ops.shape(x)
    lead, query_length, num_positions = tuple(shape[:-2]), shape[-2], shape[-1]
    key_length = num_positions if key_length is None else key_length
    pad = [[0, 0]] * (len(x.shape) - 1) + [[1, 0]]
    x = ops.pad(x, pad)  # (..., T, R + 1)
    x = ops.reshape(x, lead + (num_positions + 1, query_length))  # (..., R + 1, T)
    x = x[..., 1:, :]  # (..., R, T)
    x = ops.reshape(x, lead + (query_length, num_positions))  # (..., T, R)
    return x[..., :key_length]  # (..., T, S)


def relative_sinusoids(max_distance, num_positions, dim):
    """The Transformer-XL position table `R`, rows for distances `max_distance` downwards.

        R_r = [sin(r * f), cos(r * f)],  f_k = 1 / 10000^(2k / dim),  k = 0 .. dim/2 - 1

    Args:
        max_distance: int or scalar tensor, distance of row 0.
        num_positions: int or scalar tensor, number of rows (distances).
        dim: even int, the model width.

    Returns:
        float32 `(num_positions, dim)` tensor.
    """
    inv_freq = 1.0 / ops.power(
        10000.0, ops.arange(0, dim, 2, dtype="float32") / float(dim)
    )  # (dim/2,)
    distances = ops.cast(max_distance, "float32") - ops.arange(
        num_positions, dtype="float32"
    )  # (R,)
    angles = ops.einsum("r,f->rf", distances, inv_freq)  # (R, dim/2)
    return ops.concatenate([ops.sin(angles), ops.cos(angles)], axis=-1)  # (R, dim)


@keras.saving.register_keras_serializable(package="keras_attn")
class RelativeMultiHeadAttention(MultiHeadAttention):
    """Transformer-XL relative multi-head attention with memory (Dai et al., 2019, §3.3).

    Keys and values see the cached hidden states of the previous segment, without
    gradient; queries only the current segment:

        h~ = [SG(m) ∘ h],   q = h W_q,   k = h~ W_{k,E},   v = h~ W_v
        A_ij = ( q_i^T k_j                   (a) content: does token i look for token j
               + q_i^T W_{k,R} R_{i-j}       (b) content-dependent position bias
               + u^T k_j                     (c) global content bias
               + v^T W_{k,R} R_{i-j} ) / sqrt(d_k)   (d) global position bias
        a = Masked-Softmax(A) v,   output = Linear(a)

    `R_{i-j}` is the sinusoid of the relative distance, laid out as in the official
    code, `[sin(r f), cos(r f)]` with `f = 1 / 10000^(2k / d_model)`; it never depends
    on absolute positions, which is what lets a segment reuse the previous one's states.
    Terms (a) + (c) are one matmul `(q + u)^T k`; (b) + (d) are `(q + v)^T W_{k,R} R`
    computed against each *distance* and moved onto the keys by `relative_shift`.

    The position table always covers the distances `S-1 .. -(T-1)` (`S = M + T` keys),
    the XLNet layout, so the scores are exact for causal and bidirectional attention and
    for any explicit `attention_mask`; causal attention masks the `T - 1` negative ones.

    Weights: those of `MultiHeadAttention` (`query`, `key` = W_{k,E}, `value`,
    `attention_output`), plus the `position` sublayer (W_{k,R}, an `EinsumDense` kernel
    `(d_model, H, d_k)` without bias, as the official `r_net`), `content_bias` u and
    `position_bias` v, both `(H, d_k)`.

    Args:
        num_heads: int, number of heads `H`.
        key_dim: int, size of each query/key head `d_k`.
        **kwargs: the other arguments of `MultiHeadAttention` (`value_dim`, `dropout`,
            `use_bias`, `output_dim`, `sliding_window`, `kernel_initializer`,
            `bias_initializer`, `seed`) and of `keras.layers.Layer`. `u` and `v` are
            initialised with `bias_initializer` and exist whatever `use_bias`.
            `fused_qkv` and `rotary_max_wavelength` are rejected (no KV cache either:
            the memory plays its role).

    Call arguments:
        query: `(B, T, d_model)`, the current segment; `d_model` must be even.
        memory: optional `(B, M, d_model)`, hidden states of previous segments. No
            gradient flows into it.
        padding_mask: optional `(B, T)` (current segment only; memory counts as real)
            or `(B, M + T)` (memory then segment); True/1 for real keys. Its static
            length tells the two apart. A Keras mask on `query` is used the same way.
        attention_mask: optional boolean `(B, T, M + T)`; True where query `i` may see
            key `j`.
        use_causal_mask: bool; query `i` then sees keys `j <= M + i` (itself, its past
            and the whole memory).
        return_attention_scores: bool, also return the probabilities `(B, H, T, M + T)`.
        training: bool, enables dropout.

    Returns:
        `(B, T, d_out)`, or `(output, scores)` with `return_attention_scores`.

    Example:
    >>> attention = RelativeMultiHeadAttention(num_heads=2, key_dim=4)
    >>> segment, memory = keras.ops.ones((1, 3, 8)), keras.ops.ones((1, 5, 8))
    >>> tuple(attention(segment, memory=memory, use_causal_mask=True).shape)
    (1, 3, 8)
    """

    # The keys are `[memory; segment]`: the queries are the last `T` of them.
    _queries_end_aligned = True

    def __init__(self, num_heads, key_dim, **kwargs):
        for name, reason in _UNSUPPORTED.items():
            value = kwargs.pop(name, None)
            if value not in (None, False):
                raise ValueError(
                    f"RelativeMultiHeadAttention does not support `{name}`: {reason}. "
                    f"Received: {name}={value}"
                )
        super().__init__(num_heads=num_heads, key_dim=key_dim, **kwargs)

    # === Build ===

    def build(self, query_shape):
        d_model = query_shape[-1]
        if d_model is None or d_model % 2:
            raise ValueError(
                "The relative sinusoids R pair sin and cos features, so the query feature "
                f"size must be known and even. Received: query_shape={tuple(query_shape)}"
            )
        super().build(query_shape)
        self.position_dense = keras.layers.EinsumDense(
            "rd,dhk->rhk", output_shape=(self.num_heads, self.key_dim),
            bias_axes=None, name="position", **self._dense_kwargs(),
        )
        self.position_dense.build((None, d_model))
        self.content_bias = self.add_weight(
            name="content_bias", shape=(self.num_heads, self.key_dim),
            initializer=self._dense_kwargs()["bias_initializer"],
        )
        self.position_bias = self.add_weight(
            name="position_bias", shape=(self.num_heads, self.key_dim),
            initializer=self._dense_kwargs()["bias_initializer"],
        )

    # === Call ===

    def call(
        self,
        query,
        memory=None,
        padding_mask=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        query_mask=None,
        mask=None,
    ):
        # Keras fills `mask` (query alone) or `query_mask` (with memory) from the implicit
        # mask of the query; it marks padded keys of the current segment.
        implicit_mask = mask if query_mask is None else query_mask
        if implicit_mask is not None:
            query = ops.copy(query)  # consumed here: keep the projections from warning
        keys = None
        if memory is not None:
            if len(memory.shape) != 3 or memory.shape[-1] != query.shape[-1]:
                raise ValueError(
                    "`memory` must be (batch, memory_length, d_model) with the query's "
                    f"d_model={query.shape[-1]}. Received: memory.shape={tuple(memory.shape)}"
                )
            memory = ops.stop_gradient(ops.cast(memory, query.dtype))  # (B, M, d)
            keys = ops.concatenate([memory, query], axis=1)  # (B, M + T, d)
        padding_mask = and_masks(
            _key_padding_mask(padding_mask, query, memory),
            _key_padding_mask(implicit_mask, query, memory),
        )  # (B, M + T)
        # The parent projects q from `query`, k and v from `keys`, merges the masks with
        # the causal one aligned to the end of the keys, then calls `_compute_attention`.
        return super().call(
            query, value=keys, key=keys, padding_mask=padding_mask,
            attention_mask=attention_mask, use_causal_mask=use_causal_mask,
            return_attention_scores=return_attention_scores, training=training,
        )

    def _compute_attention(
        self, query, key, value, attention_mask=None, training=None,
        return_attention_scores=False, use_causal_mask=False, attention_bias=None,
        query_start_index=None,
    ):
        """The four Transformer-XL terms on projected `(B, T, H, d_k)` / `(B, S, H, d_k)`.

        There is no cache, so `query_start_index` is always `None`: the queries are the
        last `T` of the `S` keys, which is what `relative_shift` assumes.
        """
        attention_mask = self._add_causal_mask(
            query, key, attention_mask, use_causal_mask, query_start_index
        )  # (B, T, S) or (B, H, T, S)
        query_length, key_length = ops.shape(query)[1], ops.shape(key)[1]
        scale = 1.0 / math.sqrt(self.key_dim)
        u = ops.cast(self.content_bias, query.dtype)  # (H, dk)
        v = ops.cast(self.position_bias, query.dtype)  # (H, dk)

        # (b) + (d): (q_i + v)^T W_{k,R} R_r for every distance r = S-1 .. -(T-1).
        num_positions = key_length + query_length - 1
        d_model = self.position_dense.kernel.shape[0]
        table = relative_sinusoids(key_length - 1, num_positions, d_model)  # (R, d) float32
        positions = self.position_dense(ops.cast(table, self.compute_dtype))  # (R, H, dk)
        position_scores = ops.einsum("bthd,rhd->bhtr", query + v, positions)  # (B, H, T, R)
        position_scores = relative_shift(position_scores, key_length)  # (B, H, T, S)
        position_scores = position_scores * ops.cast(scale, position_scores.dtype)
        if attention_bias is not None:
            position_scores = position_scores + ops.cast(attention_bias, position_scores.dtype)

        # (a) + (c): (q_i + u)^T k_j, scaled, plus the position scores, masked softmax.
        return scaled_dot_product_attention(
            query + u, key, value, attention_mask=attention_mask,
            attention_bias=position_scores, scale=scale,
            dropout=lambda p: self.dropout_layer(p, training=training),
        )  # (B, T, H, dv), (B, H, T, S)

    def compute_mask(self, query, mask=None, **kwargs):
        return mask

    def compute_output_spec(
        self, query, memory=None, padding_mask=None, attention_mask=None,
        use_causal_mask=False, return_attention_scores=False, training=None,
        query_mask=None, mask=None,
    ):
        output = keras.KerasTensor(self.compute_output_shape(query.shape), self.compute_dtype)
        if not return_attention_scores:
            return output
        memory_length = 0 if memory is None else memory.shape[1]
        lengths = (memory_length, query.shape[1])
        key_length = None if None in lengths else sum(lengths)
        scores_shape = (query.shape[0], self.num_heads, query.shape[1], key_length)
        return output, keras.KerasTensor(scores_shape, self.compute_dtype)  # (B, H, T, M + T)

    def get_config(self):
        config = super().get_config()
        for name in _UNSUPPORTED:
            config.pop(name)
        return config


def _key_padding_mask(mask, query, memory):
    """A `(B, T)` or `(B, M + T)` padding mask as a `(B, M + T)` key mask (or `None`).

    A `(B, T)` mask describes the current segment; the memory is then taken as all real.
    Lengths may be unknown while tracing (segments of varying length), so the number of
    memory positions to prepend is computed from run-time shapes: `M` for a `(B, T)` mask,
    `0` for a `(B, M + T)` one.
    """
    if mask is None:
        return None
    mask = ops.cast(mask, "bool")
    memory_length = 0 if memory is None else memory.shape[1]
    query_length, length = query.shape[1], mask.shape[-1]
    static = None not in (memory_length, query_length, length)
    if len(mask.shape) != 2 or (
        static and length not in (query_length, memory_length + query_length)
    ):
        expected = "?" if None in (memory_length, query_length) else memory_length + query_length
        raise ValueError(
            "`padding_mask` must be (batch, segment_length) or (batch, memory_length + "
            f"segment_length) = (batch, {query_length}) or (batch, {expected}). "
            f"Received: padding_mask.shape={tuple(mask.shape)}"
        )
    if memory is None:
        return mask
    missing = ops.shape(memory)[1] + ops.shape(query)[1] - ops.shape(mask)[1]
    memory_mask = ops.ones((ops.shape(mask)[0], missing), dtype="bool")  # (B, M or 0)
    return ops.concatenate([memory_mask, mask], axis=1)  # (B, M + T)

