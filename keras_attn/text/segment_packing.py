"""`WordPieceTokenizer`'s packing: `[CLS] A [SEP] (B [SEP])`, cut by HF's truncation rules.

Segments are cut to fit with HF `tokenizers`' truncation rules, then laid out and padded, in
TensorFlow ops (so in `tf.data` and the exported SavedModel).
"""

import tensorflow as tf

TRUNCATION_STRATEGIES = ("longest_first", "only_first", "only_second")


def truncated_lengths(first_lengths, second_lengths, budget, truncation, sequence_length):
    """Kept lengths of both segments of a pair, following HF `tokenizers`' truncation rules.

    Args:
        first_lengths, second_lengths: int64 `(B,)`, the segments' lengths in word pieces.
        budget: int64 scalar tensor, the pieces both segments may keep together.
        truncation: one of `TRUNCATION_STRATEGIES` (`WordPieceTokenizer` documents them).
        sequence_length: int, the packed length (named in the error messages).

    Returns:
        `(kept_first, kept_second)`, int64 `(B,)`.

    Raises:
        ValueError: eagerly, when `"only_first"` / `"only_second"` cannot fit an example
            (`InvalidArgumentError` inside `tf.function` / `tf.data`).

    Example:
    >>> kept = truncated_lengths(tf.constant([9, 2], tf.int64), tf.constant([3, 2], tf.int64),
    ...                          tf.constant(6, tf.int64), "longest_first", 9)
    >>> [k.numpy().tolist() for k in kept]
    [[3, 2], [3, 2]]
    """
    excess = tf.maximum(first_lengths + second_lengths - budget, 0)  # (B,)
    if truncation == "longest_first":
        # HF: with n1 <= n2, keep n1 and fill the rest with n2; if n1 alone takes more
        # than half, give each half (the odd token to the longer, or to the second).
        swap = first_lengths > second_lengths
        short = tf.minimum(first_lengths, second_lengths)
        long = tf.maximum(first_lengths, second_lengths)
        kept_long = tf.where(short > budget, short, tf.maximum(short, budget - short))
        kept_short = short
        halve = kept_short + kept_long > budget
        kept_short = tf.where(halve, budget // 2, kept_short)
        kept_long = tf.where(halve, budget // 2 + budget % 2, kept_long)
        kept_short = tf.minimum(kept_short, short)
        kept_long = tf.minimum(kept_long, long)
        kept_first = tf.where(swap, kept_long, kept_short)
        kept_second = tf.where(swap, kept_short, kept_long)
        fits = excess == 0
        return (
            tf.where(fits, first_lengths, kept_first),
            tf.where(fits, second_lengths, kept_second),
        )
    cut_first = truncation == "only_first"
    target = first_lengths if cut_first else second_lengths
    name = "first" if cut_first else "second"
    fits = (excess == 0) | (target > excess)  # (B,)
    message = (
        f"truncation='{truncation}' cannot fit an example into "
        f"sequence_length={sequence_length}: the {name} segment is too short to "
        "absorb the excess. Use truncation='longest_first' or a longer sequence_length."
    )
    if tf.executing_eagerly():
        bad = tf.where(~fits)[:, 0].numpy().tolist()
        if bad:
            raise ValueError(
                f"{message} Examples {bad[:8]}: excess tokens "
                f"{tf.gather(excess, bad[:8]).numpy().tolist()}, {name} segment lengths "
                f"{tf.gather(target, bad[:8]).numpy().tolist()}."
            )
    check = tf.debugging.Assert(
        tf.reduce_all(fits),
        [message, "Excess tokens per example:", excess, f"{name} segment lengths:", target],
        summarize=8,
    )
    with tf.control_dependencies([check]):
        kept = tf.identity(target - excess)
    if cut_first:
        return kept, second_lengths
    return first_lengths, kept


def keep_first(ragged, lengths):
    """The first `lengths[b]` items of each row of `ragged` `(B, None)`."""
    positions = tf.ragged.range(ragged.row_lengths())  # (B, None)
    return tf.ragged.boolean_mask(ragged, positions < lengths[:, tf.newaxis])


def pack_segments(segments, cls_token_id, sep_token_id, pad_token_id, sequence_length):
    """`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, padded to `sequence_length`.

    Args:
        segments: one or two int32 `tf.RaggedTensor`s `(B, None)`, already cut to fit.
        cls_token_id, sep_token_id, pad_token_id: int, the special tokens' ids.
        sequence_length: int, the packed length.

    Returns:
        dict of `"token_ids"` (int32), `"segment_ids"` (int32) and `"padding_mask"` (bool),
        each `(B, sequence_length)`.

    Example:
    >>> out = pack_segments([tf.ragged.constant([[5, 6]]), tf.ragged.constant([[7]])],
    ...                     2, 3, 0, sequence_length=7)
    >>> out["token_ids"].numpy().tolist(), out["segment_ids"].numpy().tolist()
    ([[2, 5, 6, 3, 7, 3, 0]], [[0, 0, 0, 0, 1, 1, 0]])
    """
    like = segments[0]
    pieces = [_column(like, cls_token_id)]
    segment_ids = [0]
    for segment_id, segment in enumerate(segments):
        pieces += [segment, _column(like, sep_token_id)]
        segment_ids += [segment_id, segment_id]
    token_ids = tf.concat(pieces, axis=1)  # (B, None), at most sequence_length
    segment_ids = tf.concat(
        [tf.ones_like(piece) * segment for piece, segment in zip(pieces, segment_ids)], axis=1
    )  # (B, None)
    shape = [None, sequence_length]
    return {
        "token_ids": token_ids.to_tensor(pad_token_id, shape=shape),  # (B, L)
        "segment_ids": segment_ids.to_tensor(0, shape=shape),  # (B, L)
        "padding_mask": tf.sequence_mask(token_ids.row_lengths(), sequence_length),  # (B, L)
    }


def _column(like, token_id):
    """int32 `tf.RaggedTensor` `(B, 1)` of `token_id`, one row per row of `like`."""
    batch_size = like.nrows()
    return tf.RaggedTensor.from_tensor(
        tf.fill([batch_size, 1], tf.constant(token_id, tf.int32))
    )
