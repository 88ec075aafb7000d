"""`WordPieceTokenizer`'s general path: BERT's tables (`bert_words`), then WordPiece per word.

Every text takes this path unless it is made only of the characters of the fast path
(`fused_bert_path`); both give HF `tokenizers`' ids, and offsets in code points of the original
text.
"""

import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.text.bert_words import bert_words

# BERT's word-length limit (HF `max_input_chars_per_word`), in characters of the normalized
# word: a longer word becomes one unknown token.
MAX_CHARS_PER_WORD = 100
# Room for tf-text's byte limit: at most 4 UTF-8 bytes a character.
_MAX_BYTES_PER_WORD = 4 * MAX_CHARS_PER_WORD
# What a word over the limit is replaced with before WordPiece (one character, so one piece,
# made the unknown token afterwards): a private-use character, which normalization removes,
# so no word of a text holds it.
_LONG_WORD = "\U0010fffd"


class TableBertPath:
    """BERT's normalizer and pre-tokenizer as table lookups, then WordPiece on each word.

    Args:
        vocabulary: list of tokens.
        unknown_token: str, a token of `vocabulary`.
        lowercase: bool. Lower-case the text.
        strip_accents: bool. NFD-decompose and drop nonspacing marks.

    Example:
    >>> path = TableBertPath(["[UNK]", "cafe", "##s"], "[UNK]", lowercase=True,
    ...                      strip_accents=True)
    >>> [t.to_list() for t in path.pieces(tf.constant(["Cafés…"]), with_offsets=True)]
    [[[1, 2, 0]], [[0, 4, 5]], [[4, 5, 6]]]
    """

    def __init__(self, vocabulary, unknown_token, lowercase, strip_accents):
        self.lowercase = lowercase
        self.strip_accents = strip_accents
        self.unknown_token_id = vocabulary.index(unknown_token)
        # Also `WordPieceTokenizer.detokenize`'s kernel.
        self.wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=vocabulary, suffix_indicator="##", max_bytes_per_word=_MAX_BYTES_PER_WORD,
            token_out_type=tf.int32, unknown_token=unknown_token, no_pretokenization=True,
            support_detokenization=True)

    def pieces(self, texts, with_offsets):
        """`(ids,)` or `(ids, starts, ends)`, int32 `tf.RaggedTensor`s `(B, None)` of `(B,)`
        texts; offsets in code points of the original texts."""
        words = bert_words(texts, self.lowercase, self.strip_accents)
        ids, first_char, last_char = self._word_pieces(words)  # (W, None)
        splits = tf.gather(ids.row_splits, words.row_splits)  # (B + 1,)
        ids = tf.RaggedTensor.from_row_splits(ids.values, splits)  # (B, None)
        if not with_offsets:
            return (ids,)
        starts = ids.with_flat_values(tf.gather(words.char_starts, first_char))
        ends = ids.with_flat_values(tf.gather(words.char_ends, last_char))
        return ids, starts, ends

    def _word_pieces(self, words):
        """WordPiece of each word of a `BertWords`.

        Returns:
            `(ids, first_char, last_char)`: int32 `tf.RaggedTensor` `(W, None)` of piece ids,
            and per piece (flat, `(P,)`) the index of its first and last character in the
            `BertWords` character arrays.
        """
        num_chars = words.char_splits[1:] - words.char_splits[:-1]  # (W,)
        too_long = num_chars > MAX_CHARS_PER_WORD  # (W,)
        ids, byte_starts, byte_ends = self.wordpiece.tokenize_with_offsets(
            tf.where(too_long, _LONG_WORD, words.words))  # (W, None)
        piece_words = ids.value_rowids()  # (P,)
        word_first = tf.gather(words.char_splits, piece_words)  # (P,)
        word_last = tf.gather(words.char_splits[1:], piece_words) - 1  # (P,)
        # Pieces' byte offsets within their word, then within all words concatenated.
        char_bytes = tf.concat([words.char_bytes, tf.zeros([1], tf.int64)], 0)  # (M + 1,)
        word_bytes = tf.gather(char_bytes, word_first)  # (P,)
        piece_start = word_bytes + byte_starts.flat_values  # (P,)
        piece_end = word_bytes + byte_ends.flat_values  # (P,)
        char_bytes = words.char_bytes[tf.newaxis]  # (1, M)
        first = tf.searchsorted(char_bytes, piece_start[tf.newaxis], side="right")[0] - 1
        last = tf.searchsorted(char_bytes, piece_end[tf.newaxis], side="left")[0] - 1
        long_piece = tf.gather(too_long, piece_words)  # (P,)
        ids = ids.with_flat_values(
            tf.where(long_piece, self.unknown_token_id, ids.flat_values))
        first = tf.where(long_piece, word_first, tf.cast(first, tf.int64))
        last = tf.where(long_piece, word_last, tf.cast(last, tf.int64))
        return ids, first, last
