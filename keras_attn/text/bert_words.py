"""Raw text -> BERT's normalized words with offsets, in TensorFlow ops (`text_tables` lookups).

The words WordPiece splits into pieces, exactly as HF `tokenizers`' `BertNormalizer` +
`BertPreTokenizer` make them (Devlin et al., 2019, the basic tokenizer of BERT's
`tokenization.py`):

1. each character is normalized on its own (`text_tables.normalization_changes`): control and
   private-use characters removed, whitespace to a space; uncased: NFD, nonspacing marks
   removed, lower-cased;
2. the normalized text is cut at whitespace, and each punctuation character and CJK ideograph
   is a word of its own (`text_tables.piece_class_runs`).

Alignment, as HF reports offsets: each normalized character comes from one character of the
text and spans it alone (all of "한"'s three jamo span "한"); characters that normalization
removed (combining accents, zero-width and control characters) belong to no span.
"""

from typing import NamedTuple

import tensorflow as tf

from keras_attn.text import text_tables


class BertWords(NamedTuple):
    """The words of a batch of texts, flattened.

    Attributes:
        words: string `(W,)`, the normalized words of all texts, text after text.
        row_splits: int64 `(B + 1,)`, the words of text `b` are `words[row_splits[b]:
            row_splits[b + 1]]`.
        char_splits: int64 `(W + 1,)`, the normalized characters of word `w` are
            characters `char_splits[w]` to `char_splits[w + 1] - 1` of the arrays below.
        char_bytes: int64 `(M,)`, where each normalized character starts, in UTF-8 bytes of
            all words concatenated (`words` joined without separators).
        char_starts: int32 `(M,)`, the code point of the text each character comes from.
        char_ends: int32 `(M,)`, `char_starts + 1`, where its span ends.
    """

    words: tf.Tensor
    row_splits: tf.Tensor
    char_splits: tf.Tensor
    char_bytes: tf.Tensor
    char_starts: tf.Tensor
    char_ends: tf.Tensor


def _normalize(codes, lowercase, strip_accents):
    """Per character of `codes` (flat int32 `(N,)`), its normalized code points.

    Returns:
        `(normalized, source)`: int32 `(M,)` normalized code points and int32 `(M,)` the index
        in `codes` each comes from.
    """
    keys, row_splits, values = text_tables.normalization_arrays(lowercase, strip_accents)
    keys = tf.constant(keys)  # (K,)
    lengths_table = tf.constant(row_splits[1:] - row_splits[:-1])  # (K,)
    starts_table = tf.constant(row_splits[:-1])  # (K,)
    values = tf.constant(list(values) + [0], tf.int32)  # (V + 1,): never empty
    index = tf.minimum(tf.searchsorted(keys, codes, side="left", out_type=tf.int32),
                       tf.shape(keys)[0] - 1)  # (N,)
    changed = tf.gather(keys, index) == codes  # (N,)
    lengths = tf.where(changed, tf.gather(lengths_table, index), 1)  # (N,)
    source = tf.repeat(tf.range(tf.shape(codes)[0]), lengths)  # (M,)
    first_out = tf.repeat(tf.cumsum(lengths, exclusive=True), lengths)  # (M,)
    within = tf.range(tf.shape(source)[0]) - first_out  # (M,) k-th output of its character
    from_table = tf.gather(values, tf.gather(tf.gather(starts_table, index), source) + within)
    normalized = tf.where(tf.gather(changed, source), from_table, tf.gather(codes, source))
    return normalized, source


def _utf8_length(codes):
    """UTF-8 bytes of each code point (int32 -> int64)."""
    return tf.cast(1 + tf.cast(codes >= 0x80, tf.int32) + tf.cast(codes >= 0x800, tf.int32)
                   + tf.cast(codes >= 0x10000, tf.int32), tf.int64)


def bert_words(texts, lowercase=True, strip_accents=True):
    """BERT's words of a batch of texts with per-character alignment, in TensorFlow ops.

    Args:
        texts: string tensor `(B,)` (UTF-8; invalid bytes read as U+FFFD, which BERT removes).
        lowercase: bool. Lower-case (BERT uncased).
        strip_accents: bool. NFD-decompose and drop nonspacing marks.

    Returns:
        `BertWords`.

    Example:
    >>> out = bert_words(tf.constant(["Café, ok…", ""]))
    >>> [w.decode() for w in out.words.numpy()], out.row_splits.numpy().tolist()
    (['cafe', ',', 'ok', '…'], [0, 4, 4])
    >>> out.char_starts.numpy().tolist()
    [0, 1, 2, 3, 4, 6, 7, 8]
    """
    codes = tf.strings.unicode_decode(texts, "UTF-8", errors="replace",
                                      replacement_char=0xFFFD)  # (B, C)
    flat_codes = codes.flat_values  # (N,)
    text_rows = tf.cast(codes.value_rowids(), tf.int32)  # (N,)
    positions = tf.range(tf.shape(flat_codes)[0]) - tf.gather(
        tf.cast(codes.row_splits, tf.int32), text_rows)  # (N,) index within its text
    normalized, source = _normalize(flat_codes, lowercase, strip_accents)  # (M,)

    starts, classes = text_tables.piece_class_runs()
    kinds = tf.gather(tf.constant(classes), tf.searchsorted(
        tf.constant(starts), normalized, side="right", out_type=tf.int32) - 1)  # (M,)
    rows = tf.gather(text_rows, source)  # (M,) text of each normalized character
    first_of_text = tf.concat([[True], rows[1:] != rows[:-1]], 0)  # (M,)
    previous = tf.concat([[text_tables.WHITESPACE], kinds[:-1]], 0)  # (M,)
    in_word = kinds != text_tables.WHITESPACE  # (M,)
    starts_word = in_word & (first_of_text | (previous != text_tables.WORD)
                             | (kinds == text_tables.SINGLE))  # (M,)
    word_index = tf.boolean_mask(tf.cumsum(tf.cast(starts_word, tf.int32)) - 1, in_word)
    num_words = tf.reduce_sum(tf.cast(starts_word, tf.int32))
    word_codes = tf.boolean_mask(normalized, in_word)  # (M',)
    characters = tf.RaggedTensor.from_value_rowids(word_codes, word_index, nrows=num_words)
    word_rows = tf.boolean_mask(rows, starts_word)  # (W,)
    row_splits = tf.RaggedTensor.from_value_rowids(
        word_rows, word_rows, nrows=tf.cast(codes.nrows(), tf.int32)).row_splits  # (B + 1,)
    word_source = tf.boolean_mask(source, in_word)  # (M',)
    return BertWords(
        words=tf.strings.unicode_encode(characters, "UTF-8"),
        row_splits=tf.cast(row_splits, tf.int64),
        char_splits=tf.cast(characters.row_splits, tf.int64),
        char_bytes=tf.cumsum(_utf8_length(word_codes), exclusive=True),
        char_starts=tf.gather(positions, word_source),
        char_ends=tf.gather(positions, word_source) + 1,
    )
