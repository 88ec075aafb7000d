"""Attention masks: padding, causal, sliding-window and explicit, merged in one place.

Every attention layer of keras-attn builds its mask through `merge_attention_masks`, so
there is exactly one definition of "which key may query i look at". A mask is boolean:
`True` means *may attend*. Masked positions receive a large negative score before the
softmax, which is the `M` matrix of the source notes (0 where allowed, -inf elsewhere):

    MaskedAttention(Q, K, V) = softmax((Q K^T + M) / sqrt(d_k)) V

Layers that first combine several padding masks of the same keys (an explicit
`padding_mask` and a Keras implicit mask) do it with `and_masks`.
"""

from keras import ops

from keras_attn.layers.validation import check_positive_int
from keras_attn.layers.validation import check_rank


def causal_mask(query_length, key_length, query_start_index=None):
    """Lower-triangular mask: query `i` sees key `j` iff `j <= i + offset`.

    Query row `i` sits at absolute position `query_start_index + i` of the key sequence.
    With the default `query_start_index=None` the queries are aligned with the *end* of
    the keys (`offset = key_length - query_length`), which is right both for plain
    self-attention (`offset = 0`) and for keys that are `[memory; current]`
    (Transformer-XL). During cached decoding pass the cache index explicitly.

    Args:
        query_length: int or scalar tensor, T.
        key_length: int or scalar tensor, S.
        query_start_index: optional int or scalar tensor, absolute position of query 0.

    Returns:
        Boolean tensor of shape `(1, T, S)`.

    Example:
    >>> ops.convert_to_numpy(causal_mask(3, 3))[0].astype(int)
    array([[1, 0, 0],
           [1, 1, 0],
           [1, 1, 1]])
    """
    row, col = query_key_positions(query_length, key_length, query_start_index)
    return ops.expand_dims(ops.greater_equal(row, col), 0)  # (1, T, S)


def sliding_window_mask(query_length, key_length, window, query_start_index=None):
    """Local attention band: query `i` sees key `j` iff `|pos(i) - j| < window`.

    This is the symmetric band of `keras.layers.MultiHeadAttention(sliding_window=w)`;
    combined with `causal_mask` it gives the causal window `pos(i) - w < j <= pos(i)`
    (Longformer / Mistral style local attention).

    Returns:
        Boolean tensor of shape `(1, T, S)`.
    """
    check_positive_int(
        "sliding_window", window,
        "the number of positions a query may look to each side, itself included",
    )
    row, col = query_key_positions(query_length, key_length, query_start_index)
    return ops.expand_dims(ops.less(ops.abs(row - col), window), 0)  # (1, T, S)


def merge_attention_masks(
    query_length,
    key_length,
    query_mask=None,
    key_mask=None,
    attention_mask=None,
    use_causal_mask=False,
    sliding_window=None,
    query_start_index=None,
):
    """Combines every mask source into one boolean `(B, T, S)` mask (or `None`).

    Precedence is simple: the sources are AND-ed, so a key is visible to a query only if
    *every* given source allows it. Sources:

    - `query_mask` `(B, T)`: padded queries (Keras' implicit mask of the query). A fully
      masked query row produces a zero attention output, never NaN.
    - `key_mask` `(B, S)`: padded keys (`padding_mask`, Keras' implicit mask of the value).
    - `attention_mask` `(B, T, S)` (or `(T, S)`): an explicit mask from the caller; a
      rank-4 `(B, H, T, S)` one masks each head separately, and the result is then rank 4.
    - `use_causal_mask`: `causal_mask(T, S, query_start_index)`.
    - `sliding_window`: `sliding_window_mask(T, S, window, query_start_index)`.

    Returns:
        Boolean tensor broadcastable to `(B, T, S)` (`(B, H, T, S)` for a per-head
        `attention_mask`), or `None` when no source is given.
    """
    sources = []
    if query_mask is not None:
        check_rank("query_mask", query_mask.shape, (2,), "(batch, query_length)")
        sources.append(ops.expand_dims(ops.cast(query_mask, "bool"), -1))  # (B, T, 1)
    if key_mask is not None:
        check_rank("padding_mask", key_mask.shape, (2,), "(batch, key_length)")
        sources.append(ops.expand_dims(ops.cast(key_mask, "bool"), -2))  # (B, 1, S)
    if attention_mask is not None:
        check_rank(
            "attention_mask", attention_mask.shape, (2, 3, 4),
            "(batch, query_length, key_length) or per head (batch, num_heads, "
            "query_length, key_length)",
        )
        attention_mask = ops.cast(attention_mask, "bool")
        if len(attention_mask.shape) == 2:
            attention_mask = ops.expand_dims(attention_mask, 0)  # (1, T, S)
    if use_causal_mask:
        sources.append(causal_mask(query_length, key_length, query_start_index))  # (1, T, S)
    if sliding_window is not None:
        sources.append(
            sliding_window_mask(query_length, key_length, sliding_window, query_start_index)
        )  # (1, T, S)
    if attention_mask is not None and len(attention_mask.shape) == 4:
        sources = [ops.expand_dims(source, 1) for source in sources]  # (B, 1, T, S)
    if attention_mask is not None:
        sources.append(attention_mask)  # (B, T, S) or (B, H, T, S)
    return and_masks(*sources)  # (B, T, S), (B, H, T, S) or None


def and_masks(*masks):
    """Logical AND of boolean masks of broadcastable shapes, skipping the `None`s.

    Each mask is cast to bool first, so int (1/0) padding masks mix with boolean ones.

    Returns:
        The broadcast AND of the given masks, or `None` when all of them are `None`.

    Example:
    >>> padding = ops.convert_to_tensor([[1, 1, 0]])
    >>> implicit = ops.convert_to_tensor([[True, False, True]])
    >>> ops.convert_to_numpy(and_masks(padding, None, implicit))
    array([[ True, False, False]])
    """
    masks = [ops.cast(mask, "bool") for mask in masks if mask is not None]
    if not masks:
        return None
    merged = masks[0]
    for mask in masks[1:]:
        merged = ops.logical_and(merged, mask)
    return merged


def query_key_positions(query_length, key_length, query_start_index=None):
    """Absolute positions of queries `(T, 1)` and keys `(1, S)`, int32.

    The one position convention of the library (masks, ALiBi, T5 buckets, relative
    attention): key `j` is at position `j`; query `i` is at `query_start_index + i`, and
    `query_start_index=None` aligns the queries with the end of the keys (`S - T`).
    """
    if query_start_index is None:
        query_start_index = key_length - query_length
    start = ops.cast(query_start_index, "int32")
    row = ops.arange(query_length, dtype="int32")[:, None] + start  # (T, 1)
    col = ops.arange(key_length, dtype="int32")[None, :]  # (1, S)
    return row, col
