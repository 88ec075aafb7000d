import keras
from keras import ops

from keras_attn.layers.validation import check_positive_int


def permutation_lm_inputs(token_ids, num_predict, padding_mask=None, segment_ids=None,
                          span_length=1, seed=None, order_noise=None):
    """Samples factorization orders and builds XLNet's permutation-LM inputs in-graph.

    Yang et al. (2019), §2.2-2.3: for an order `z` of the positions, token `x_{z_t}` is
    predicted from `x_{z<t}`. Partial prediction keeps only the last `P = num_predict`
    positions of each order as targets (the paper's `1/K` with `P = T / K`); the first
    `T - P` (the context `z<=c`) see each other, as in the official code:

        visible[i, j] = rank_j < rank_i  or  (i != j and both i, j in the context)

    so no position ever sees its own token in the query stream, and a target sees the
    whole context and the targets before it. With `span_length > 1` the order is drawn
    over spans of consecutive positions (kept left to right inside a span), so a span
    of targets is predicted together: the span-grouped variant. Padding
    (`padding_mask == 0`) goes first in every order (never a target when a row has at
    least `P` real tokens; its label weight is 0 otherwise).

    Args:
        token_ids: `(B, T)` int tensor.
        num_predict: int `P`, targets per row (`<= T`).
        padding_mask: optional `(B, T)`, 1 for real tokens. Defaults to all real.
        segment_ids: optional `(B, T)` int. Defaults to zeros.
        span_length: int, positions per span of the order. Defaults to `1`.
        seed: int or `keras.random.SeedGenerator`; the same int gives the same orders.
        order_noise: optional `(B, ceil(T / span_length))` floats that replace the
            random draw: spans are ordered by increasing noise (e.g. numpy draws seeded
            per example, so an example's order does not depend on its batch).

    Returns:
        `(inputs, labels, label_weights)`: the `XLNetLM` input dict (`token_ids`,
        `segment_ids`, `padding_mask`, `permutation_mask` `(B, T, T)` int,
        `target_mapping` `(B, P, T)` float32), the `(B, P)` target ids and `(B, P)`
        float32 weights (0 for padded targets) — the `(x, y, sample_weight)` of `fit`.

    Example:
    >>> inputs, labels, weights = permutation_lm_inputs(np.array([[7, 8, 9, 10]]),
    ...                                                 num_predict=2, seed=0)
    >>> tuple(inputs["permutation_mask"].shape), tuple(labels.shape)
    ((1, 4, 4), (1, 2))
    """
    check_positive_int("num_predict", num_predict)
    check_positive_int("span_length", span_length)
    token_ids = ops.cast(ops.convert_to_tensor(token_ids), "int32")
    batch, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
    if isinstance(length, int) and num_predict > length:
        raise ValueError(
            f"`num_predict` must be at most the sequence length {length}. "
            f"Received: num_predict={num_predict}")
    real = (ops.ones((batch, length), "int32") if padding_mask is None
            else ops.cast(padding_mask, "int32"))  # (B, T)
    segment_ids = (ops.zeros((batch, length), "int32") if segment_ids is None
                   else ops.cast(segment_ids, "int32"))

    # === Order: a random rank per span, left to right inside it, padding first ===
    positions = ops.arange(length, dtype="int32")  # (T,)
    num_spans = (length + span_length - 1) // span_length
    noise = (keras.random.uniform((batch, num_spans), seed=seed) if order_noise is None
             else ops.convert_to_tensor(order_noise, "float32"))  # (B, N)
    span_rank = ops.argsort(ops.argsort(noise, axis=-1), axis=-1)  # (B, N)
    span_rank = ops.take(span_rank, positions // span_length, axis=1)  # (B, T)
    key = ops.cast(span_rank * span_length + positions % span_length + 1, "int32")
    key = key * real  # (B, T): 0 for padding, so it comes first
    rank = ops.argsort(ops.argsort(key, axis=-1), axis=-1)  # (B, T), 0 .. T-1

    # === Masks: targets are the last P of the order ===
    first_target = length - num_predict
    context = rank < first_target  # (B, T)
    earlier = rank[:, None, :] < rank[:, :, None]  # (B, T, T): j before i
    both_context = ops.logical_and(context[:, :, None], context[:, None, :])
    not_self = ops.logical_not(ops.eye(length, dtype="bool"))[None]  # (1, T, T)
    visible = ops.logical_or(earlier, ops.logical_and(both_context, not_self))
    targets = ops.arange(num_predict, dtype="int32") + first_target  # (P,)
    target_mapping = ops.equal(rank[:, None, :], targets[None, :, None])  # (B, P, T)
    target_mapping = ops.cast(target_mapping, "float32")
    labels = ops.cast(ops.einsum("bpt,bt->bp", target_mapping,
                                 ops.cast(token_ids, "float32")), "int32")  # (B, P)
    weights = ops.einsum("bpt,bt->bp", target_mapping, ops.cast(real, "float32"))
    inputs = {
        "token_ids": token_ids, "segment_ids": segment_ids, "padding_mask": real,
        "permutation_mask": ops.cast(visible, "int32"), "target_mapping": target_mapping,
    }
    return inputs, labels, weights
