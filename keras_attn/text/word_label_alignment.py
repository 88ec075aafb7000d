"""Word tags and subword positions: alignment for training (in-graph), decoding of predictions.

A word-level tag sequence (CoNLL) meets a subword model here: `align_word_labels` puts each
word's tag at its FIRST subword; the other subwords, `[CLS]` and `[SEP]` get `IGNORE_LABEL`
(-100), which the token-classification loss ignores. `decode_word_labels` reads the model's
prediction at a word's first subword back as the word's tag.
"""

import numpy as np
import tensorflow as tf

from keras_attn.layers.validation import check_int

IGNORE_LABEL = -100

# ------------------------------------------------------------------------------------------------
# Alignment (in-graph)


def align_word_labels(
    word_piece_ids,
    word_labels=None,
    *,
    cls_token_id,
    sep_token_id,
    sequence_length=None,
    ignore_label=IGNORE_LABEL,
    unknown_token_id=None,
):
    """Flattens per-word subwords into `[CLS] pieces [SEP]` with first-subword labels.

    Every op is a TensorFlow op, so this runs inside `tf.data.Dataset.map`.

    Args:
        word_piece_ids: int `tf.RaggedTensor` (B, W, None): the subword ids of each word (e.g.
            `WordPieceTokenizer.tokenize_words(words)`).
        word_labels: int tensor (B, W) (dense, every row W words) or `tf.RaggedTensor` (B, None)
            with the same words per row as `word_piece_ids`; `None` at inference.
        cls_token_id, sep_token_id: int. Ids of `[CLS]` and `[SEP]`.
        sequence_length: int or `None`. Maximum length including `[CLS]` and `[SEP]`; longer
            sentences lose their last subwords (the `[SEP]` stays) and the words whose first
            subword is cut are counted in `num_truncated_words`. `None` keeps everything.
        ignore_label: int. Label of non-first subwords and specials. Defaults to `-100`.
        unknown_token_id: int or `None`. A word without subwords (made only of characters
            the tokenizer drops, e.g. U+00A0 or U+200B) gets this id (`[UNK]`) as its one
            subword, so its label has a position and is trained and predicted there. `None`
            (the default) gives it no position: no prediction, `decode_word_labels` fills it.

    Returns:
        dict of `tf.RaggedTensor` (B, None), one value per subword:
        - `token_ids`: `[CLS]`, the subwords, `[SEP]` (dtype of `word_piece_ids`);
        - `segment_ids`: zeros (int32); `padding_mask`: ones (bool);
        - `word_ids`: index of the word each subword belongs to, `-1` for `[CLS]`/`[SEP]`;
        - `labels` (only with `word_labels`): the word's label at its first subword,
          `ignore_label` elsewhere;
        and two (B,) int32 counts: `num_truncated_words` (words dropped by `sequence_length`) and
        `num_words_without_pieces` (words the tokenizer turned into no subword: without
        `unknown_token_id` they get no position, so no prediction; `decode_word_labels`
        fills them).

    Example:
    >>> pieces = tf.ragged.constant([[[7], [8, 9]], [[5, 6, 4]]], ragged_rank=2)
    >>> out = align_word_labels(pieces, tf.ragged.constant([[1, 2], [3]]),
    ...                         cls_token_id=101, sep_token_id=102)
    >>> out["token_ids"].to_list()
    [[101, 7, 8, 9, 102], [101, 5, 6, 4, 102]]
    >>> out["labels"].to_list()
    [[-100, 1, 2, -100, -100], [-100, 3, -100, -100, -100]]
    >>> out["word_ids"].to_list()
    [[-1, 0, 1, 1, -1], [-1, 0, 0, 0, -1]]
    """
    _check_alignment_arguments(word_piece_ids, sequence_length)
    check_int("unknown_token_id", unknown_token_id, low=0, optional=True)
    pieces = word_piece_ids
    dtype = pieces.dtype
    batch_size = pieces.nrows(out_type=tf.int32)
    word_row = tf.cast(pieces.value_rowids(), tf.int32)  # (total_words,) sentence of each word
    without_pieces = tf.cast(pieces.values.row_lengths() == 0, tf.int32)  # (total_words,)
    num_words_without_pieces = tf.math.unsorted_segment_sum(
        without_pieces, word_row, batch_size
    )  # (B,)
    if unknown_token_id is not None:
        pieces = _fill_empty_words(pieces, unknown_token_id)
    words = pieces.values  # (total_words, None) subwords of each word
    total_words = tf.shape(word_row)[0]
    word_in_sentence = tf.range(total_words) - tf.gather(
        tf.cast(pieces.row_starts(), tf.int32), word_row
    )  # (total_words,)
    piece_word = tf.cast(words.value_rowids(), tf.int32)  # (total_pieces,) flat word of a piece
    total_pieces = tf.shape(piece_word)[0]
    word_starts = tf.cast(words.row_starts(), tf.int32)  # (total_words,) flat start of each word
    is_first = tf.equal(tf.range(total_pieces), tf.gather(word_starts, piece_word))

    flat = pieces.merge_dims(1, 2)  # (B, None) all subwords of a sentence
    sentence_starts = tf.cast(flat.row_starts(), tf.int32)  # (B,)

    def per_piece(values):  # (total_pieces,) -> (B, None) ragged like `flat`
        return tf.RaggedTensor.from_row_splits(values, flat.row_splits, validate=False)

    word_ids = per_piece(tf.gather(word_in_sentence, piece_word))  # (B, None)
    labels = None
    if word_labels is not None:
        flat_labels = _flat_word_labels(word_labels, pieces)  # (total_words,)
        labels = per_piece(
            tf.where(is_first, tf.gather(flat_labels, piece_word), ignore_label)
        )  # (B, None)

    num_truncated_words = tf.zeros([batch_size], tf.int32)
    if sequence_length is not None:
        body_length = sequence_length - 2
        num_truncated_words = _words_cut(words, word_row, sentence_starts, body_length)
        flat, word_ids = flat[:, :body_length], word_ids[:, :body_length]
        if labels is not None:
            labels = labels[:, :body_length]

    token_ids = _wrap(flat, cls_token_id, sep_token_id, dtype)
    outputs = {
        "token_ids": token_ids,
        "segment_ids": tf.zeros_like(token_ids, dtype=tf.int32),
        "padding_mask": tf.ones_like(token_ids, dtype=tf.bool),
        "word_ids": _wrap(word_ids, -1, -1, tf.int32),
        "num_truncated_words": num_truncated_words,
        "num_words_without_pieces": num_words_without_pieces,
    }
    if labels is not None:
        outputs["labels"] = _wrap(labels, ignore_label, ignore_label, tf.int32)
    return outputs


def _words_cut(words, word_row, sentence_starts, body_length):
    """(B,) int32: per sentence, the words whose first subword lies past `body_length`.

    Args:
        words: `tf.RaggedTensor` (total_words, None), the subwords of each word.
        word_row: int32 (total_words,), the sentence of each word.
        sentence_starts: int32 (B,), the flat index of each sentence's first subword.
        body_length: int, subwords kept between `[CLS]` and `[SEP]`.
    """
    word_starts = tf.cast(words.row_starts(), tf.int32)  # (total_words,)
    start_in_sentence = word_starts - tf.gather(sentence_starts, word_row)  # (total_words,)
    cut = (start_in_sentence >= body_length) & (words.row_lengths() > 0)  # (total_words,)
    return tf.math.unsorted_segment_sum(
        tf.cast(cut, tf.int32), word_row, tf.shape(sentence_starts)[0])  # (B,)


def _check_alignment_arguments(word_piece_ids, sequence_length):
    if not isinstance(word_piece_ids, tf.RaggedTensor) or word_piece_ids.shape.rank != 3:
        raise ValueError(
            "`word_piece_ids` must be a RaggedTensor of shape (batch, words, pieces). "
            f"Received: word_piece_ids={word_piece_ids!r}"
        )
    check_int("sequence_length", sequence_length, low=3,
              meaning="[CLS], one subword, [SEP]", optional=True)
    if word_piece_ids.ragged_rank != 2:
        raise ValueError(
            "`word_piece_ids` must be ragged in both the word and the piece dimension "
            f"(ragged_rank=2). Received: ragged_rank={word_piece_ids.ragged_rank}"
        )


def _flat_word_labels(word_labels, pieces):
    """`(total_words,)` int32 labels of every word in `pieces`' order, from ragged `(B, None)`
    or dense `(B, W)` `word_labels`; asserts one label per word of each row of `pieces`."""
    if isinstance(word_labels, tf.RaggedTensor):
        tf.debugging.assert_equal(
            tf.cast(word_labels.row_lengths(), tf.int64),
            tf.cast(pieces.row_lengths(), tf.int64),
            message="`word_labels` must have one label per word of `word_piece_ids`.",
        )
        return tf.cast(word_labels.values, tf.int32)  # (total_words,)
    word_labels = tf.convert_to_tensor(word_labels)
    tf.debugging.assert_equal(
        tf.cast(tf.shape(word_labels)[1], tf.int64),
        tf.cast(pieces.row_lengths(), tf.int64),
        message="Dense `word_labels` (B, W) need W words in every row of "
        "`word_piece_ids`; pass a RaggedTensor for sentences of different lengths.",
    )
    return tf.cast(tf.reshape(word_labels, [-1]), tf.int32)  # (B * W,) == (total_words,)


def _fill_empty_words(pieces, token_id):
    """`pieces` (B, W, None) with `[token_id]` as the subwords of each word that has none."""
    words = pieces.values  # (total_words, None)
    empty = tf.equal(words.row_lengths(), 0)  # (total_words,)
    filler = tf.RaggedTensor.from_row_lengths(
        tf.fill([tf.reduce_sum(tf.cast(empty, tf.int32))], tf.cast(token_id, words.dtype)),
        tf.cast(empty, words.row_splits.dtype),
    )  # (total_words, None): one id in each empty word, nothing elsewhere
    return pieces.with_values(tf.concat([words, filler], axis=1))


def _wrap(body, first, last, dtype):
    """`[first] + row + [last]` for each row of the ragged `(B, None)` `body`."""
    def column(value):  # (B, 1)
        return tf.RaggedTensor.from_tensor(
            tf.fill([body.nrows(out_type=tf.int32), 1], tf.cast(value, dtype)))

    return tf.concat([column(first), body, column(last)], axis=1)


# ------------------------------------------------------------------------------------------------
# Decoding


def first_piece_mask(word_ids):
    """True at the first word piece of each word: where the word's tag is predicted.

    Args:
        word_ids: `(B, S)` int array, the word index of each piece, `-1` for specials and
            padding (the `word_ids` of `align_word_labels`, padded with -1).

    Returns:
        bool numpy array `(B, S)`.

    Example:
    >>> first_piece_mask([[-1, 0, 0, 1, -1]]).astype(int).tolist()
    [[0, 1, 0, 1, 0]]
    """
    word_ids = np.asarray(word_ids)
    previous = np.concatenate([np.full((len(word_ids), 1), -1), word_ids[:, :-1]], axis=1)
    return (word_ids >= 0) & (word_ids != previous)


def decode_word_labels(predictions, word_ids, num_words, label_vocabulary=None, fill_label="O"):
    """Word-level tags from subword predictions: each word takes its first subword's prediction.

    Args:
        predictions: (B, S) predicted class ids or (B, S, C) logits / probabilities (argmax is
            taken), numpy or tensor.
        word_ids: (B, S) word index of each subword, `-1` for specials and padding (the
            `word_ids` of `align_word_labels`, padded with -1).
        num_words: (B,) number of words in each sentence.
        label_vocabulary: `LabelVocabulary` or `None`. With it, ids become tag strings.
        fill_label: the tag given to words without a subword (truncated away or turned into no
            subword by the tokenizer); an id when `label_vocabulary` is `None`.

    Returns:
        `(word_labels, num_filled)`: a list of B lists (one tag per word) and how many words got
        `fill_label` because they had no subword, so nothing is filled silently.

    Example:
    >>> word_ids = np.array([[-1, 0, 1, 1, -1, -1]])
    >>> decode_word_labels(np.array([[0, 3, 1, 2, 0, 0]]), word_ids, [3], fill_label=0)
    ([[3, 1, 0]], 1)
    """
    predictions = np.asarray(predictions)
    word_ids = np.asarray(word_ids)
    if predictions.ndim == 3:
        predictions = predictions.argmax(axis=-1)
    if predictions.shape != word_ids.shape or predictions.ndim != 2:
        raise ValueError(
            "`predictions` (B, S) or (B, S, C) and `word_ids` (B, S) must agree. Received: "
            f"predictions.shape={predictions.shape}, word_ids.shape={word_ids.shape}"
        )
    num_words = [int(n) for n in np.asarray(num_words).reshape(-1)]
    if len(num_words) != word_ids.shape[0]:
        raise ValueError(
            f"`num_words` needs one count per sentence ({word_ids.shape[0]}). "
            f"Received: num_words={num_words}"
        )
    previous = np.concatenate([np.full((word_ids.shape[0], 1), -1), word_ids[:, :-1]], axis=1)
    first = (word_ids >= 0) & (word_ids != previous)  # (B, S) first subword of a word
    results = []
    num_filled = 0
    for row, count in enumerate(num_words):
        labels = [None] * count
        for position in np.flatnonzero(first[row]):
            word = int(word_ids[row, position])
            if word >= count:
                raise ValueError(
                    f"Sentence {row} has a subword of word {word} but `num_words` is {count}."
                )
            label = int(predictions[row, position])
            labels[word] = label_vocabulary.labels[label] if label_vocabulary else label
        num_filled += labels.count(None)
        results.append([fill_label if label is None else label for label in labels])
    return results, num_filled
