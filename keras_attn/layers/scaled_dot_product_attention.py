"""Scaled dot-product attention, the core op every multi-head layer calls."""

import math

from keras import ops

# The stand-in for -inf in masked float32 scores: finite, so fully masked rows stay finite.
_MASKED_SCORE = -1e9


def masked_softmax(scores, mask=None, axis=-1):
    """Softmax over keys that ignores masked positions.

    The softmax is computed in float32 whatever the input dtype (bfloat16/float16 scores
    lose probability mass otherwise) and cast back. Rows whose keys are all masked give
    all-zero probabilities instead of a uniform distribution over padding.

    Args:
        scores: `(..., T, S)` float tensor.
        mask: optional boolean tensor broadcastable to `scores`; `True` = may attend.

    Returns:
        Probabilities with the shape and dtype of `scores`.
    """
    dtype = scores.dtype
    scores = ops.cast(scores, "float32")
    if scores.shape[axis] == 1:
        # One key (the first decoding step): its probability is 1. Keras warns on a
        # softmax over a size-1 axis, so skip it.
        probs = ops.ones_like(scores)
        return ops.cast(probs if mask is None else ops.where(mask, probs, 0.0), dtype)
    if mask is None:
        return ops.cast(ops.softmax(scores, axis=axis), dtype)
    mask = ops.cast(mask, "bool")
    scores = ops.where(mask, scores, _MASKED_SCORE)
    probs = ops.softmax(scores, axis=axis)
    probs = ops.where(mask, probs, 0.0)
    return ops.cast(probs, dtype)


def scaled_dot_product_attention(
    query,
    key,
    value,
    attention_mask=None,
    attention_bias=None,
    scale=None,
    dropout=None,
):
    """Multi-head scaled dot-product attention (Vaswani et al., 2017, §3.2.1).

        Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k) + B + M) V

    where `B` is an optional additive bias (T5 relative buckets, ALiBi) and `M` the mask
    (0 where `attention_mask` is True, -inf elsewhere).

    Args:
        query: `(B, T, H, d_k)` projected queries.
        key: `(B, S, H, d_k)` projected keys.
        value: `(B, S, H, d_v)` projected values.
        attention_mask: optional boolean, broadcastable to `(B, H, T, S)`; a `(B, T, S)`
            mask is broadcast over heads.
        attention_bias: optional float, broadcastable to `(B, H, T, S)`, added to the
            scaled scores.
        scale: float multiplying `Q K^T`. Defaults to `1 / sqrt(d_k)`.
        dropout: optional callable applied to the attention probabilities (e.g. a bound
            `keras.layers.Dropout`), for attention dropout during training.

    Returns:
        Tuple `(output, probabilities)`: `(B, T, H, d_v)` and `(B, H, T, S)`.

    Example:
    >>> q = k = v = keras.ops.ones((1, 2, 1, 4))
    >>> out, probs = scaled_dot_product_attention(q, k, v)
    >>> keras.ops.convert_to_numpy(probs)[0, 0]
    array([[0.5, 0.5],
           [0.5, 0.5]], dtype=float32)
    """
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    # Scaling the (smaller) query before the matmul keeps half-precision scores in range.
    query = ops.multiply(query, ops.cast(scale, query.dtype))
    scores = ops.einsum("bthd,bshd->bhts", query, key)  # (B, H, T, S)
    if attention_bias is not None:
        scores = ops.add(scores, ops.cast(attention_bias, scores.dtype))
    if attention_mask is not None and len(attention_mask.shape) == 3:
        attention_mask = ops.expand_dims(attention_mask, 1)  # (B, 1, T, S)
    probs = masked_softmax(scores, attention_mask)  # (B, H, T, S)
    dropped = dropout(probs) if dropout is not None else probs
    output = ops.einsum("bhts,bshd->bthd", dropped, value)  # (B, T, H, d_v)
    return output, probs
