"""Named-entity recognition around a subword model: label alignment, decoding, BIO repair, metrics.

A word-level tag sequence (CoNLL) meets a subword model in four places:

1. `align_word_labels` (in-graph): each word's tag goes to its FIRST subword; the other subwords,
   `[CLS]` and `[SEP]` get `IGNORE_LABEL` (-100), which the token-classification loss ignores.
2. `decode_word_labels`: the model's prediction at a word's first subword is the word's tag.
3. `repair_iob2` / `entity_spans`: turn predicted tags into valid IOB2 and into entity spans with
   character offsets.
4. `entity_scores`: strict IOB2 entity precision / recall / F1, equal to
   `seqeval.metrics.classification_report(..., mode="strict", scheme=IOB2)` (micro average).

Entity rules. In strict IOB2 an entity is a `B-X` followed by any number of `I-X`; an `I-X` that
does not continue an `X` entity (after `O`, at the start, after another type) belongs to no
entity. `repair_iob2` instead follows the conlleval convention (also seqeval's default, non-strict
mode): such an `I-X` starts a new entity, i.e. `O I-X` -> `O B-X` and `B-X I-Y` -> `B-X B-Y`.
Repairing predictions before scoring gives them conlleval's credit for entities that start with
`I-`; scoring unrepaired predictions is the strict (lower or equal) number.
"""

import collections
import re

import numpy as np
import tensorflow as tf

from keras_attn.layers.validation import check_int

IGNORE_LABEL = -100
IOB_TAG = re.compile(r"^(O|[BI]-\S+)$")  # one tag of the IOB1/IOB2 schemes

Entity = collections.namedtuple("Entity", ["type", "start", "end"])
Entity.__doc__ = """An entity over words `[start, end)` (end exclusive) of type `type` (`"PER"`)."""


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


# ------------------------------------------------------------------------------------------------
# IOB2 rules


def _check_tags(tags, where=""):
    for position, tag in enumerate(tags):
        if not isinstance(tag, str) or not IOB_TAG.match(tag):
            raise ValueError(
                f"Malformed tag {tag!r} at position {position}{where}: expected 'O', 'B-<TYPE>' "
                "or 'I-<TYPE>'."
            )


def repair_iob2(tags):
    """Makes a tag sequence valid IOB2 with the conlleval rule: an `I-X` that does not continue
    an `X` entity starts one (`O I-X` -> `O B-X`, `B-X I-Y` -> `B-X B-Y`, `I-X` first -> `B-X`).

    Returns:
        `(repaired_tags, num_repairs)`.

    Example:
    >>> repair_iob2(["O", "I-PER", "I-PER", "B-LOC", "I-ORG"])
    (['O', 'B-PER', 'I-PER', 'B-LOC', 'B-ORG'], 2)
    """
    tags = list(tags)
    _check_tags(tags)
    repaired = []
    previous_type = None
    num_repairs = 0
    for tag in tags:
        if tag.startswith("I-") and tag[2:] != previous_type:
            tag = "B-" + tag[2:]
            num_repairs += 1
        repaired.append(tag)
        previous_type = None if tag == "O" else tag[2:]
    return repaired, num_repairs


def iob2_entities(tags):
    """Entities of a tag sequence under strict IOB2: `B-X` then any `I-X`; other `I-` tags belong
    to no entity.

    Example:
    >>> iob2_entities(["B-PER", "I-PER", "O", "I-LOC", "B-ORG", "I-LOC"])
    [Entity(type='PER', start=0, end=2), Entity(type='ORG', start=4, end=5)]
    """
    tags = list(tags)
    _check_tags(tags)
    entities = []
    start = None
    entity_type = None
    for position, tag in enumerate(tags + ["O"]):
        if start is not None and not (tag.startswith("I-") and tag[2:] == entity_type):
            entities.append(Entity(entity_type, start, position))
            start = None
        if tag.startswith("B-"):
            start, entity_type = position, tag[2:]
    return entities


def entity_spans(tags, word_offsets, text=None):
    """Entities with character offsets, from word tags and each word's `(start, end)` characters.

    Tags are read as strict IOB2 (`repair_iob2` them first for conlleval-style entities).

    Args:
        tags: list of str, one IOB2 tag per word.
        word_offsets: list of `(start_char, end_char)` per word (end exclusive); for subword
            tokenizer output use `word_offsets_from_subwords`.
        text: str or `None`. The original text; with it each span carries its `text`.

    Returns:
        list of dicts `{"type", "start_word", "end_word", "start_char", "end_char"[, "text"]}`
        (`end_*` exclusive).

    Example:
    >>> text = "Peter Blackburn visits Paris"
    >>> offsets = [(0, 5), (6, 15), (16, 22), (23, 28)]
    >>> [span["text"] for span in entity_spans(["B-PER", "I-PER", "O", "B-LOC"], offsets, text)]
    ['Peter Blackburn', 'Paris']
    """
    tags = list(tags)
    if len(tags) != len(word_offsets):
        raise ValueError(
            f"`tags` and `word_offsets` need one entry per word. Received: {len(tags)} tags, "
            f"{len(word_offsets)} offsets"
        )
    spans = []
    for entity in iob2_entities(tags):
        start_char = int(word_offsets[entity.start][0])
        end_char = int(word_offsets[entity.end - 1][1])
        span = {"type": entity.type, "start_word": entity.start, "end_word": entity.end,
                "start_char": start_char, "end_char": end_char}
        if text is not None:
            span["text"] = text[start_char:end_char]
        spans.append(span)
    return spans


def word_offsets_from_subwords(start_chars, end_chars, word_ids, num_words):
    """Character offsets of words from their subwords' offsets: `(start of the first subword,
    end of the last)`; a word with no subword (truncated) gets `None`.

    Args:
        start_chars, end_chars: (S,) character offsets of each subword (the tokenizer's
            `tokenize_with_offsets`, aligned with `word_ids`).
        word_ids: (S,) word index of each subword, `-1` for specials and padding.
        num_words: int. Number of words.

    Example:
    >>> word_offsets_from_subwords([0, 0, 5, 8, 0], [0, 5, 8, 11, 0], [-1, 0, 1, 1, -1], 2)
    [(0, 5), (5, 11)]
    """
    offsets = [None] * int(num_words)
    for start, end, word in zip(np.asarray(start_chars).tolist(), np.asarray(end_chars).tolist(),
                                np.asarray(word_ids).tolist()):
        if word < 0:
            continue
        if offsets[word] is None:
            offsets[word] = (int(start), int(end))
        else:
            offsets[word] = (offsets[word][0], int(end))
    return offsets


# ------------------------------------------------------------------------------------------------
# Metrics


def _ratio(numerator, denominator):
    return numerator / denominator if denominator else 0.0


def _f1(precision, recall):
    return 2 * precision * recall / (precision + recall) if precision + recall else 0.0


def entity_scores(y_true, y_pred):
    """Strict IOB2 entity precision, recall and F1 (micro average) and per-type scores.

    An entity counts as correct only when its type, first and last word all match (CoNLL-2003
    evaluation). Entities are read with `iob2_entities` (strict: an `I-X` that continues no `X`
    entity is not part of any entity), which makes the numbers equal to
    `seqeval.metrics.{precision,recall,f1}_score(y_true, y_pred, mode="strict", scheme=IOB2)`.
    A ratio with a zero denominator is 0 (as seqeval's default `zero_division`).

    Args:
        y_true, y_pred: lists of sentences, each a list of tags (`O`, `B-X`, `I-X`); a sentence
            of `y_pred` must be as long as the same sentence of `y_true`.

    Returns:
        dict with `precision`, `recall`, `f1`, the counts `true_entities`, `predicted_entities`,
        `correct_entities`, and `per_type`: `{type: {"precision", "recall", "f1", "support"}}`.

    Example:
    >>> scores = entity_scores([["B-PER", "I-PER", "O", "B-LOC"]], [["B-PER", "I-PER", "O", "O"]])
    >>> scores["precision"], scores["recall"], round(scores["f1"], 4)
    (1.0, 0.5, 0.6667)
    """
    if len(y_true) != len(y_pred):
        raise ValueError(
            f"`y_true` and `y_pred` must hold the same number of sentences. Received: "
            f"{len(y_true)} and {len(y_pred)}"
        )
    true_set, pred_set = set(), set()
    for sentence, (true_tags, pred_tags) in enumerate(zip(y_true, y_pred)):
        if len(true_tags) != len(pred_tags):
            raise ValueError(
                f"Sentence {sentence} has {len(true_tags)} true tags but {len(pred_tags)} "
                "predicted tags."
            )
        for entity in iob2_entities(true_tags):
            true_set.add((sentence,) + tuple(entity))
        for entity in iob2_entities(pred_tags):
            pred_set.add((sentence,) + tuple(entity))
    correct = true_set & pred_set
    per_type = {}
    for entity_type in sorted({entity[1] for entity in true_set | pred_set}):
        n_true = sum(1 for entity in true_set if entity[1] == entity_type)
        n_pred = sum(1 for entity in pred_set if entity[1] == entity_type)
        n_correct = sum(1 for entity in correct if entity[1] == entity_type)
        precision, recall = _ratio(n_correct, n_pred), _ratio(n_correct, n_true)
        per_type[entity_type] = {"precision": precision, "recall": recall,
                                 "f1": _f1(precision, recall), "support": n_true}
    precision = _ratio(len(correct), len(pred_set))
    recall = _ratio(len(correct), len(true_set))
    return {
        "precision": precision,
        "recall": recall,
        "f1": _f1(precision, recall),
        "true_entities": len(true_set),
        "predicted_entities": len(pred_set),
        "correct_entities": len(correct),
        "per_type": per_type,
    }
